"""Identifiers that end up in streams have a stated byte limit and one refusal code at every entry point (the host
API, MCP over stdio and HTTP, the CLI); a refused call leaves nothing stored."""

import os
import subprocess
import sys

import pytest
from mcp import Client
from mcp.shared.exceptions import MCPError
from mcp_types.jsonrpc import INVALID_REQUEST

from treemail.adapters import keys
from treemail.domain import limits
from treemail.domain.commands import SendContext
from treemail.domain.limits import IdentifierError

from treemail.host import Treemail

from .conftest import adapters, make_config, running_stack
from .test_mcp import call, error_code, http_client, http_server, stdio

HUGE = "x" * (4 * 1024 * 1024)  # the 4 MB tool call id that was kept in a recipient's stream for good
RULES = {"child": "allow", "parent": "allow"}


async def family(host):
    root = await host.register_root("planner", "plans", rules=RULES)
    child = await host.register_child(root.session_id, "explore", "reads", rules=RULES, status="idle")
    await host.start_run(root.session_id, "run-1")
    return root, child


async def stored(host, *sessions) -> list[int]:
    """Each session's stream length, and the partition's: what a refused call must not change."""
    redis = adapters(host).redis
    out = []
    for session in sessions:
        record = await adapters(host).sessions.record(session.session_id)
        out.append(await redis.xlen(keys.session_stream(record.partition, record.session_id)))
    return out


def refused(call_) -> str:
    with pytest.raises(IdentifierError) as caught:
        call_()
    return caught.value.code


async def refused_async(awaitable) -> str:
    with pytest.raises(IdentifierError) as caught:
        await awaitable
    return caught.value.code


async def test_the_host_api_refuses_oversized_identifiers_with_one_code_and_stores_nothing(redis_url):
    async with running_stack(redis_url) as host:
        root, child = await family(host)
        before = await stored(host, root, child)
        assert refused(lambda: SendContext(root.session_id, "run-1", HUGE)) == limits.TOO_LONG
        assert refused(lambda: SendContext(root.session_id, "r" * 257, "call-1")) == limits.TOO_LONG
        # Not an AttributeError deep inside: a missing identifier is refused where it is given.
        assert refused(lambda: SendContext(None, "run-1", "call-1")) == limits.INVALID
        assert await refused_async(host.send(root.session_id, child.handle, "hi", idempotency_key="k" * 201)) \
            == limits.TOO_LONG
        assert await refused_async(host.start_run(child.session_id, "r" * 257)) == limits.TOO_LONG
        assert await refused_async(host.claim(child.session_id, "r" * 257)) == limits.TOO_LONG
        assert await refused_async(host.finish_run(root.session_id, "run-1", "s" * 65)) == limits.TOO_LONG
        assert await refused_async(host.finish_run(root.session_id, "run-1", "completed", "c" * 40000)) \
            == limits.TOO_LONG
        assert await refused_async(host.disposal.dispose(child.session_id, "s" * 65)) == limits.TOO_LONG
        assert await refused_async(host.tools.mint_token(root.session_id, "r" * 257)) == limits.TOO_LONG
        assert await stored(host, root, child) == before
        # A registration refused stores nothing at all: no directory entry, no tree member.
        members = await adapters(host).redis.scard(keys.tree_members(0, root.session_id))
        assert await refused_async(host.register_child(root.session_id, "t" * 65)) == limits.TOO_LONG
        assert await refused_async(host.register_child(root.session_id, "t", "d" * 5000)) == limits.TOO_LONG
        assert await adapters(host).redis.scard(keys.tree_members(0, root.session_id)) == members
        # At the limit is fine: the limits are stated, not guessed.
        sent = await host.send_message(SendContext(root.session_id, "run-1", "c" * limits.MAX_ID_BYTES),
                                       {"to": child.handle, "body": "hi"})
        assert "message_id" in sent, sent


async def test_mcp_stdio_and_http_refuse_an_oversized_tool_call_id_in_meta_as_a_tool_error(redis_url):
    async with running_stack(redis_url) as host:
        root, child = await family(host)
        before = await stored(host, root, child)
        big = "m" * (limits.MAX_ID_BYTES + 1)
        async with Client(stdio(redis_url, root.session_id), cache=None) as client:
            assert error_code(await call(client, {"to": child.handle, "body": "hi"}, big)) == limits.TOO_LONG
        token = await host.tools.mint_token(root.session_id)
        async with http_server(host) as url:
            async with http_client(url, token) as client:
                assert error_code(await call(client, {"to": child.handle, "body": "hi"}, big)) == limits.TOO_LONG
        assert await stored(host, root, child) == before


async def test_an_mcp_token_whose_session_no_longer_exists_gets_one_clear_error(redis_url, caplog):
    async with running_stack(redis_url) as host:
        root, child = await family(host)
        token = await host.tools.mint_token(child.session_id)
        await adapters(host).redis.delete(keys.directory(child.session_id))
        # A server process that never saw the session (none has it cached).
        server_host = await Treemail.connect(make_config(redis_url), redis_url)
        async with http_server(server_host) as url:
            async with http_client(url, token) as client:
                assert (await client.list_tools()).tools == []
                for _ in range(2):
                    with pytest.raises(MCPError) as caught:
                        await call(client, {"to": root.handle, "body": "hi"})
                    assert caught.value.error.code == INVALID_REQUEST
                    assert "no longer exists" in caught.value.error.message
        await server_host.close()
        assert "Traceback" not in caplog.text


async def test_the_cli_refuses_an_oversized_stop_reason_in_one_line_and_stores_nothing(redis_url):
    async with running_stack(redis_url) as host:
        root, child = await family(host)
        before = await stored(host, root, child)
        env = {**os.environ, "REDIS_URL": redis_url}
        done = subprocess.run([sys.executable, "-m", "treemail", "dispose", child.session_id, "--stop-reason",
                               "s" * 65], env=env, capture_output=True, text=True, timeout=60)
        assert done.returncode == 2
        assert done.stderr.count("\n") == 1 and limits.TOO_LONG in done.stderr and "Traceback" not in done.stderr
        assert await stored(host, root, child) == before
