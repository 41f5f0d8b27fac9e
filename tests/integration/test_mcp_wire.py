"""Every request a `treemail mcp` stdio process reads gets an answer, whatever bytes it is sent.

The server is a real child process; the test is its client, writing raw lines to its stdin and reading
its stdout, so nothing between them repairs a line first.
"""

import asyncio
import json
import os
import sys

import pytest

from treemail.producers.mcp import framing

from ..conftest import backend_env
from .conftest import running_stack
from .test_mcp import CHILD_ENV

INITIALIZE = {"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
    "protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "raw", "version": "1"}}}


def call(request_id: int, body: bytes) -> bytes:
    return (b'{"jsonrpc":"2.0","id":%d,"method":"tools/call","params":{"name":"send_message",'
            b'"arguments":{"to":"nobody_12345678","body":%s}}}' % (request_id, body))


class RawClient:
    def __init__(self, process) -> None:
        self.process = process

    async def exchange(self, line: bytes) -> dict:
        self.process.stdin.write(line + b"\n")
        await self.process.stdin.drain()
        answer = await asyncio.wait_for(self.process.stdout.readline(), 30)
        assert answer, "the server closed its stdout"
        return json.loads(answer)


@pytest.fixture
async def raw_server(redis_url):
    async with running_stack(redis_url) as host:
        root = await host.register_root("planner", "plans", rules={"child": "allow"})
        env = {**os.environ, "REDIS_URL": redis_url, **CHILD_ENV, **backend_env()}
        process = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "treemail", "mcp", "--session", root.session_id, env=env,
            stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE)
        client = RawClient(process)
        try:
            assert "result" in await client.exchange(json.dumps(INITIALIZE).encode())
            process.stdin.write(b'{"jsonrpc":"2.0","method":"notifications/initialized"}\n')
            yield client
        finally:
            process.stdin.close()
            await asyncio.wait_for(process.wait(), 30)


# Each unreadable request with the id and JSON-RPC error it is answered with, over stdio and HTTP alike: a
# line or a body that is not UTF-8, not JSON or nested too deep is a parse error (-32700); JSON that is no
# JSON-RPC request (no method, a null id) or a message over the size bound is an invalid request (-32600); a
# lone surrogate escape is valid JSON but no Unicode text, so in a request's params it is invalid params (-32602).
UNREADABLE = [
    (call(3, b'"\\ud800"'), 3, -32602),                         # a lone surrogate: the case that hung for ever
    (call(4, b'"\xff\xfe"'), 4, -32700),                        # invalid UTF-8
    (b"not json", None, -32700),
    (call(5, b"[" * 5000 + b"]" * 5000), 5, -32700),             # nested too deep
    (b"{" * 100_000, None, -32700),
    (b'{"jsonrpc":"2.0","id":6}', 6, -32600),                    # neither a request nor a response
    (b'{"jsonrpc":"2.0","id":null,"method":"tools/list"}', None, -32600),
    (b'{"jsonrpc":"2.0","id":"\\udc00","method":"tools/list"}', None, -32600),  # an id that is no text
    (call(8, b'"' + b"x" * framing.MAX_FRAME_BYTES + b'"'), 8, -32600),  # over the size bound (HTTP status 413)
]


@pytest.mark.parametrize("line, request_id, code", UNREADABLE)
async def test_a_line_the_server_cannot_read_is_answered_with_its_json_rpc_error_and_the_next_is_served(
    raw_server, line, request_id, code,
):
    refused = await raw_server.exchange(line)
    assert (refused["id"], refused["error"]["code"]) == (request_id, code), refused
    listed = await raw_server.exchange(b'{"jsonrpc":"2.0","id":99,"method":"tools/list"}')
    assert listed["id"] == 99 and [t["name"] for t in listed["result"]["tools"]] == ["send_message"]


async def test_over_http_each_unreadable_body_gets_the_json_rpc_error_stdio_answers_it_with_and_the_next_is_served(
    raw_server, redis_url,
):
    """The same bodies, sent over stdio and over HTTP: the same id and code from both (HTTP status 400)."""
    import httpx2

    from .test_mcp import http_server

    async with running_stack(redis_url) as host:
        root = await host.register_root("planner", "plans", rules={"child": "allow"})
        token = await host.tools.mint_token(root.session_id)
        headers = {"Authorization": f"Bearer {token}", "Accept": "application/json, text/event-stream",
                   "Content-Type": "application/json", "MCP-Protocol-Version": "2025-06-18"}
        over_stdio, over_http = [], []
        async with http_server(host) as url, httpx2.AsyncClient(timeout=30) as raw:
            for body, _, _ in UNREADABLE:
                answer = await raw_server.exchange(body)
                over_stdio.append((answer["id"], answer["error"]["code"]))
                refused = await raw.post(url, content=body, headers=headers)
                assert refused.status_code == (413 if len(body) > framing.MAX_FRAME_BYTES else 400), refused.text
                over_http.append((refused.json()["id"], refused.json()["error"]["code"]))
                listed = await raw.post(url, json={"jsonrpc": "2.0", "id": 7, "method": "tools/list"}, headers=headers)
                assert listed.status_code == 200 and listed.json()["id"] == 7
            # A notification is never answered over either: over HTTP it is accepted (202), with no body.
            noted = await raw.post(url, content=b'{"jsonrpc":"2.0","method":"notifications/x","params":{"a":"\\ud800"}}',
                                   headers=headers)
            assert (noted.status_code, noted.content) == (202, b"")
            # A stranger is refused by the bearer check before its body is read.
            stranger = await raw.post(url, content=b"not json", headers={**headers, "Authorization": "Bearer nope"})
            assert stranger.status_code == 401
        assert over_http == over_stdio == [(request_id, code) for _, request_id, code in UNREADABLE]
