import json

import pytest

from treemail.domain import compactjson

VALUES = [
    {"a": 1, "b": [1.5, 0.1 + 0.2, None, True], "c": {"d": "é 中文 🙂 \u2028 \"q\" \\ \n"}},
    ["m-1", "agent", None, 0, "steer", "accepted", None, 4, 0, 1796012340.7790163, 0.0, 0.0, "", ""],
    {"": {}, "big": 2**62, "neg": -7, "empty": []},
]


@pytest.mark.parametrize("value", VALUES)
def test_compact_json_reads_back_as_the_standard_encoder_writes_it(value):
    text = compactjson.dumps(value)

    assert json.loads(text) == json.loads(json.dumps(value)) == value
    assert text == json.dumps(value, separators=(",", ":"), ensure_ascii=False)


def test_what_json_cannot_write_is_refused_as_the_standard_encoder_refuses_it():
    with pytest.raises(TypeError):
        compactjson.dumps({"s": {1, 2}})
