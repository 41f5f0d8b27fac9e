"""The command wire format: every entry is checked alone, and what is no command says why and whom to answer."""

import json

import pytest

from treemail.adapters.codec import InvalidCommand, encode_command, parse_command
from treemail.domain.commands import SendArguments, SendContext, SendMessage

COMMAND = SendMessage("cmd-1", SendContext("s", "r", "c"), SendArguments("explore_1a2b3c4d", "hi", "queue"), "client")


def entry(**changes) -> str:
    data = json.loads(encode_command(COMMAND))
    for name, value in changes.items():
        if name in ("to", "body", "mode"):
            data["args"][("to", "body", "mode").index(name)] = value
        else:
            data[name] = value
    return json.dumps(data)


def test_a_command_survives_the_round_trip():
    assert parse_command(encode_command(COMMAND)) == COMMAND


@pytest.mark.parametrize(("changes", "reason"), [
    ({"to": 123}, "`to` must be a string, not int"),
    ({"body": ["x"]}, "`body` must be a string, not list"),
    ({"mode": "bogus"}, "`mode` must be \"steer\" or \"queue\""),
    ({"to": "\ud800"}, "`to` must be a string, not a string with a lone surrogate"),
    ({"ctx": ["s", "r"]}, "`ctx` must be [session id, run id, tool call id]"),
    ({"args": "to body mode"}, "`args` must be [to, body, mode] (and content blocks)"),
])
def test_an_entry_with_wrong_types_or_values_is_invalid_and_answerable(changes, reason):
    with pytest.raises(InvalidCommand) as invalid:
        parse_command(entry(**changes))
    assert (invalid.value.reason, invalid.value.command_id, invalid.value.reply_to) == (reason, "cmd-1", "client")


@pytest.mark.parametrize("data", [entry(id=5), entry(reply_to="x" * 1000), "[1, 2, 3]"])
def test_an_entry_that_names_nobody_to_answer_is_invalid_and_unanswered(data):
    with pytest.raises(InvalidCommand) as invalid:
        parse_command(data)
    assert invalid.value.command_id is None or invalid.value.reply_to is None


def test_an_entry_that_is_not_json_is_not_a_command():
    with pytest.raises(ValueError):
        parse_command(b"{not json")
