"""Every model-facing tool's parser refuses unknown arguments with its own code and a bounded echo."""

import pytest

from treemail.domain.errors import Code, Rejected
from treemail.producers.tools import interrupt as interrupt_tool
from treemail.producers.tools import peer as peer_tools
from treemail.producers.tools import send_message as tool

MANY = {f"k{i}": i for i in range(100_000)}


@pytest.mark.parametrize(("parse", "arguments", "code"), [
    (tool.parse_arguments, {"to": "x", "body": "y"}, Code.INVALID_ARGUMENTS),
    (interrupt_tool.parse_arguments, {"to": "x"}, Code.INTERRUPT_INVALID_ARGUMENTS),
    (peer_tools.parse_send, {"peer": "x", "body": "y"}, Code.PEER_INVALID_ARGUMENTS),
])
def test_unknown_arguments_are_named_a_few_at_a_time_under_the_tools_own_code(parse, arguments, code):
    with pytest.raises(Rejected) as refused:
        parse({**arguments, **MANY})
    assert refused.value.code is code
    assert len(refused.value.message) < 600
    assert "and 99995 more" in refused.value.message and "k0" in refused.value.message


def test_send_message_lists_its_arguments_in_the_tools_order():
    with pytest.raises(Rejected) as refused:
        tool.parse_arguments({"to": "x", "body": "y", "sender": "me"})
    assert refused.value.message == "unknown argument(s) sender; allowed: to, body, mode"
