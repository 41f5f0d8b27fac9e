"""Bad tool arguments over MCP, sent by the official SDK's client over stdio and over streamable HTTP: each is a
tool error carrying its stable code (never an internal error), whose text echoes at most a bounded prefix of
the input; nothing is stored; and the server goes on serving. (A lone surrogate never reaches a tool: it is
refused as invalid params by the JSON-RPC framing on both transports, ``test_mcp_wire.py``.)"""

import contextlib

import pytest
from mcp import Client
from mcp.shared.exceptions import MCPError

from .conftest import adapters, running_stack
from .test_bad_input import MAX_ECHO, everything
from .test_mcp import call, error_code, http_client, http_server, stdio

INVALID = "send_message:invalid_arguments"
# Over every field's limit and the body's, and well within one message's size bound (a request over that is
# refused whole, as an invalid request: ``test_mcp_wire.py``).
HUGE = "x" * (1024 * 1024)


def bad_arguments(to: str) -> list[tuple[str, dict, str | None, str]]:
    """(what, arguments, tool call id, the code it is answered with)."""
    return [
        ("to 1 MiB", {"to": HUGE, "body": "x"}, None, INVALID),
        ("to not text", {"to": 5, "body": "x"}, None, INVALID),
        ("body 1 MiB", {"to": to, "body": HUGE}, None, "send_message:invalid_body"),
        ("body a number", {"to": to, "body": 5}, None, INVALID),
        ("body an object", {"to": to, "body": {"text": "x"}}, None, INVALID),
        ("body blocks where blocks are off", {"to": to, "body": [{"type": "text", "text": "x"}]}, None, INVALID),
        ("mode 1 MiB", {"to": to, "body": "x", "mode": HUGE}, None, INVALID),
        ("mode a number", {"to": to, "body": "x", "mode": 5}, None, INVALID),
        ("urgent not a flag", {"to": to, "body": "x", "urgent": "yes"}, None, INVALID),
        ("in_reply_to 1 MiB", {"to": to, "body": "x", "in_reply_to": HUGE}, None, INVALID),
        ("in_reply_to a list", {"to": to, "body": "x", "in_reply_to": ["m"]}, None, INVALID),
        ("an argument named with 1 MiB", {HUGE: 1, "to": to, "body": "x"}, None, INVALID),
        ("tool call id 1 MiB", {"to": to, "body": "x"}, HUGE, "identifier:too_long"),
        # Not taken for no id (a fresh one each time): a retry under it would send the message again.
        ("tool call id a number", {"to": to, "body": "x"}, 7, "identifier:invalid"),
        ("tool call id a list", {"to": to, "body": "x"}, ["a"], "identifier:invalid"),
        ("tool call id a flag", {"to": to, "body": "x"}, True, "identifier:invalid"),
    ]


@contextlib.asynccontextmanager
async def client_over(transport: str, host, redis_url: str, session_id: str):
    if transport == "stdio":
        async with Client(stdio(redis_url, session_id), cache=None) as client:
            yield client
    else:
        token = await host.tools.mint_token(session_id)
        async with http_server(host) as url, http_client(url, token) as client:
            yield client


@pytest.mark.parametrize("transport", ["stdio", "http"])
async def test_each_bad_tool_argument_is_a_coded_bounded_tool_error_that_stores_nothing_and_the_server_serves_on(
    redis_url, transport,
):
    async with running_stack(redis_url) as host:
        root = await host.register_root("planner", "plans", rules={"child": "allow"})
        child = await host.register_child(root.session_id, "explore", "reads", rules={"parent": "allow"})
        await host.start_run(root.session_id, "run-1")
        redis = adapters(host).redis
        async with client_over(transport, host, redis_url, root.session_id) as client:
            assert [t.name for t in (await client.list_tools()).tools] == ["send_message"]
            before = await everything(redis)
            answered = []
            for what, arguments, call_id, _ in bad_arguments(child.handle):
                result = await call(client, arguments, call_id)
                answered.append((what, error_code(result)))
                assert len(result.content[0].text) < MAX_ECHO, (what, result.content[0].text[:200])
            # A tool that is not there is the protocol's error (invalid params), its name echoed only in part. (The
            # client also sends the name in an HTTP header, so over HTTP a name past the header bound is refused
            # by the HTTP server before any of this: 4,000 characters stay under it.)
            with pytest.raises(MCPError, match="Unknown tool") as unknown:
                await call(client, {"to": child.handle, "body": "x"}, name="x" * 4000)
            assert len(str(unknown.value)) < MAX_ECHO
            after = await everything(redis)
            assert sorted(set(after.items()) ^ set(before.items())) == []  # nothing stored by any of them
            sent = await call(client, {"to": child.handle, "body": "still here"}, "good-1")
            assert not sent.is_error, sent
        assert answered == [(what, code) for what, _, _, code in bad_arguments(child.handle)]
