"""Every request a `treemail mcp` stdio process reads gets an answer, whatever bytes it is sent.

The server is a real child process; the test is its client, writing raw lines to its stdin and reading
its stdout, so nothing between them repairs a line first.
"""

import asyncio
import json
import os
import sys

import pytest

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


@pytest.mark.parametrize("line, request_id, code", [
    (call(3, b'"\\ud800"'), 3, -32602),                          # a lone surrogate: the case that hung for ever
    (call(4, b'"\xff\xfe"'), 4, -32700),                         # invalid UTF-8
    (b"not json", None, -32700),
    (call(5, b"[" * 5000 + b"]" * 5000), 5, -32700),             # nested too deep
    (b"{" * 100_000, None, -32700),
    (b'{"jsonrpc":"2.0","id":6}', 6, -32600),                    # neither a request nor a response
    (b'{"jsonrpc":"2.0","id":null,"method":"tools/list"}', None, -32600),
])
async def test_a_line_the_server_cannot_read_is_answered_with_its_json_rpc_error_and_the_next_is_served(
    raw_server, line, request_id, code,
):
    refused = await raw_server.exchange(line)
    assert (refused["id"], refused["error"]["code"]) == (request_id, code), refused
    listed = await raw_server.exchange(b'{"jsonrpc":"2.0","id":99,"method":"tools/list"}')
    assert listed["id"] == 99 and [t["name"] for t in listed["result"]["tools"]] == ["send_message"]


async def test_over_http_each_unreadable_request_is_answered_400_with_a_json_rpc_error_and_the_next_served(redis_url):
    import httpx2

    from .test_mcp import http_server

    async with running_stack(redis_url) as host:
        root = await host.register_root("planner", "plans", rules={"child": "allow"})
        token = await host.tools.mint_token(root.session_id)
        headers = {"Authorization": f"Bearer {token}", "Accept": "application/json, text/event-stream",
                   "Content-Type": "application/json", "MCP-Protocol-Version": "2025-06-18"}
        async with http_server(host) as url, httpx2.AsyncClient(timeout=30) as raw:
            # The SDK's HTTP transport reads a whole body as JSON: a lone surrogate is its parse error there.
            for body, code in ((call(3, b'"\\ud800"'), -32700), (call(4, b'"\xff"'), -32700), (b"not json", -32700),
                               (call(5, b"[" * 5000 + b"]" * 5000), -32700), (b'{"jsonrpc":"2.0","id":6}', -32602)):
                refused = await raw.post(url, content=body, headers=headers)
                assert refused.status_code == 400 and refused.json()["error"]["code"] == code, refused.text
                listed = await raw.post(url, json={"jsonrpc": "2.0", "id": 7, "method": "tools/list"}, headers=headers)
                assert listed.status_code == 200 and listed.json()["id"] == 7
