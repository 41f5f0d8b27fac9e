"""Every line of the MCP stdio transport is read as a message or answered with the JSON-RPC error it earns."""

import json

import pytest

from treemail.producers.mcp import framing
from treemail.producers.mcp.framing import MAX_DEPTH, Refusal

CALL = b'{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"send_message","arguments":{"body":%s}}}'


def call_with(body: bytes) -> bytes:
    return CALL % body


@pytest.mark.parametrize("line, expected", [
    (call_with(b'"\\ud800"'), (7, -32602)),                      # an escaped lone surrogate: not Unicode text
    (call_with(b'"\\udc00 tail"'), (7, -32602)),
    (b'{"jsonrpc":"2.0","id":"\\ud800","method":"tools/list"}', (None, -32600)),
    (b"not json", (None, -32700)),
    (b'{"jsonrpc":"2.0","id":8,"method":"tools/list"', (8, -32700)),   # cut short: its id still answered
    (call_with(b'NaN'), (7, -32700)),
    (call_with(b'"\xff\xfe"'), (7, -32700)),                     # invalid UTF-8: never read with replacements
    (b"[" * 100_000 + b"]" * 100_000, (None, -32700)),
    (call_with(b"[" * (MAX_DEPTH + 1) + b"]" * (MAX_DEPTH + 1)), (7, -32700)),
    (call_with(b"[" * 5000 + b"]" * 5000), (7, -32700)),
    (b'{"jsonrpc":"2.0","id":9}', (9, -32600)),                  # neither a request nor a response
    (b'{"jsonrpc":"2.0","id":[1],"method":"tools/list"}', (None, -32600)),
    (b"[]", (None, -32600)),
])
def test_a_line_the_sdk_could_not_read_is_answered_with_its_error_and_the_requests_id(line, expected):
    judged = framing.judge(line)
    assert isinstance(judged, Refusal), judged
    assert (judged.id, judged.code) == expected


def test_a_readable_message_passes_as_json_and_a_notification_is_never_answered():
    deep_enough = b"[" * 90 + b"]" * 90
    assert json.loads(framing.judge(call_with(deep_enough)))["id"] == 7
    assert json.loads(framing.judge(call_with(b'"[{ not nesting \\" ]"')))["params"]["arguments"]["body"] == (
        '[{ not nesting " ]')
    assert framing.judge(b'{"jsonrpc":"2.0","method":"notifications/x","params":{"a":"\\ud800"}}') is None
    assert framing.judge(b'{"jsonrpc":"2.0","method":5}') is None   # a notification, unreadable: unanswered
    assert framing.judge(b"  \r\n") is None


def test_the_id_of_an_object_too_deep_to_parse_is_read_without_parsing_its_other_members():
    deep = "[" * 10_000 + '"]}"' + "]" * 10_000
    assert framing.top_level_id('{"params":{"a":' + deep + ',"s":"}{"},"id":"r-1"}') == "r-1"
    assert framing.top_level_id('{"id":true}') is None
    assert framing.top_level_id("[1]") is None


@pytest.mark.parametrize("request_id", [b"null", b"1.5", b"true", b'{"a":1}'])
def test_an_id_that_is_neither_a_string_nor_a_whole_number_is_an_invalid_request(request_id):
    judged = framing.judge(b'{"jsonrpc":"2.0","id":%s,"method":"tools/list"}' % request_id)
    assert judged == Refusal(None, -32600, "Invalid request: an id must be a string or a whole number")


def test_a_clients_response_is_never_answered_even_when_unreadable():
    assert framing.judge(b'{"jsonrpc":"2.0","id":3,"result":5}') is None
    assert framing.judge(b'{"jsonrpc":"2.0","id":null,"error":{"code":-32700,"message":"\\ud800"}}') is None
    assert json.loads(framing.judge(b'{"jsonrpc":"2.0","id":3,"result":{}}')) == {"jsonrpc": "2.0", "id": 3, "result": {}}


def test_a_message_over_the_size_bound_is_an_invalid_request_with_the_id_read_from_the_part_kept():
    bulk = b'"' + b"x" * framing.MAX_FRAME_BYTES + b'"'
    refused = framing.judge(call_with(bulk))
    assert (refused.id, refused.code) == (7, -32600) and str(framing.MAX_FRAME_BYTES) in refused.message
    just_under = call_with(b'"' + b"x" * (framing.MAX_FRAME_BYTES - len(call_with(b'""'))) + b'"')
    assert isinstance(framing.judge(just_under), str)  # at the bound itself: read as usual
