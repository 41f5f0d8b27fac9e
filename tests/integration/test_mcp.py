"""`treemail mcp` driven by the MCP SDK's own client, over stdio and streamable HTTP, against the real stack.

Stdio servers are real child processes (`python -m treemail mcp --session ...`);
HTTP servers are the real Starlette app under uvicorn on loopback, with the bearer tokens the host
mints. The workers deciding the sends are the running_stack's.
"""

import asyncio
import contextlib
import os
import subprocess
import sys

import httpx2
import pytest
from mcp import Client, StdioServerParameters
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client
from mcp.shared.exceptions import MCPError

from treemail.domain import ids
from treemail.domain import events as ev
from treemail.host import Treemail
from treemail.producers.tools import send_message as tool
from treemail.producers.mcp.server import TOOL_CALL_META, http_app

from ..conftest import backend_env
from .conftest import live, make_config, running_stack, serving

# What the stdio child processes need to publish where the in-test workers read.
CHILD_ENV = {"TREEMAIL_SERVICE_COMMAND_STREAMS": "2", "TREEMAIL_SERVICE_DECISION_TIMEOUT_S": "10"}


def stdio(url: str, session_id: str, *extra: str) -> StdioServerParameters:
    env = {**os.environ, "REDIS_URL": url, **CHILD_ENV, **backend_env()}
    return StdioServerParameters(
        command=sys.executable, args=["-m", "treemail", "mcp", "--session", session_id, *extra],
        env=env,
    )


@contextlib.asynccontextmanager
async def http_server(host: Treemail, **options):
    """``options``: ``http_app``'s own (``receive=True``: its sessions receive, their claims under a lease)."""
    async with serving(http_app(host, "127.0.0.1", 0, **options)) as url:
        yield f"{url}/mcp"


@contextlib.asynccontextmanager
async def http_client(url: str, token: str, mode: str = "auto"):
    async with create_mcp_http_client(headers={"Authorization": f"Bearer {token}"}) as http:
        async with Client(streamable_http_client(url, http_client=http), cache=None, mode=mode) as client:
            yield client


async def call(client: Client, arguments: dict, call_id: str | None = None, name: str = "send_message"):
    return await client.call_tool(name, arguments, meta={TOOL_CALL_META: call_id} if call_id else None)


def error_code(result) -> str | None:
    if not result.is_error:
        return None
    code = result.structured_content["error"]["code"]
    assert result.content[0].text.startswith(f"{code}: "), "the model reads the stable code first"
    return code


async def accepted(host: Treemail, session_id: str) -> list[ev.ProducerMessageAccepted]:
    return [e for _, e in await host.history(session_id) if isinstance(e, ev.ProducerMessageAccepted)]


# ---- stdio ------------------------------------------------------------------------------------------


# "legacy": the initialize handshake of the protocol versions most agents speak today; "auto": 2026-07-28.
@pytest.mark.parametrize("mode", ["auto", "legacy"])
async def test_stdio_lists_the_tool_sends_and_a_retried_call_returns_the_original_message_id(redis_url, mode):
    async with running_stack(redis_url) as host:
        root = await host.register_root("planner", "plans", rules={"child": "allow"})
        child = await host.register_child(root.session_id, "explore", "reads", rules={"parent": "allow"})
        await host.start_run(root.session_id, "run-1")
        async with Client(stdio(redis_url, root.session_id), cache=None, mode=mode) as client:
            listed = (await client.list_tools()).tools
            assert [t.name for t in listed] == ["send_message"]
            assert listed[0].input_schema == tool.tool_definition([("child", "allow")])["input_schema"]

            first = await call(client, {"to": child.handle, "body": "look at cache.py"}, "tool-use-1")
            assert not first.is_error
            message_id = first.structured_content["message_id"]
            assert first.structured_content == {"message_id": message_id, "mode": "steer", "recipient_state": "queued"}
            assert message_id in first.content[0].text

            retried = await call(client, {"to": child.handle, "body": "look at cache.py"}, "tool-use-1")
            assert retried.structured_content["message_id"] == message_id

            refused = await call(client, {"to": root.handle, "body": "me"})
            assert error_code(refused) == "send_message:self_send"

        (event,) = await accepted(host, child.session_id)
        # Session from the binding, run the session's current one, tool call id from the request's _meta.
        assert (event.sender_session_id, event.run_id, event.tool_call_id) == (root.session_id, "run-1", "tool-use-1")


async def test_stdio_takes_a_handle_as_every_command_does_and_reports_the_package_version(redis_url):
    import importlib.metadata

    async with running_stack(redis_url) as host:
        root = await host.register_root("planner", "plans", rules={"child": "allow"})
        child = await host.register_child(root.session_id, "explore", "reads", rules={"parent": "allow"})
        await host.start_run(root.session_id, "run-1")
        async with Client(stdio(redis_url, root.handle), cache=None) as client:
            assert client.server_info.version == importlib.metadata.version("treemail")
            sent = await call(client, {"to": child.handle, "body": "by handle"}, "tool-use-h")
            assert not sent.is_error, sent
        (event,) = await accepted(host, child.session_id)
        assert event.sender_session_id == root.session_id


async def test_stdio_session_without_rules_sees_no_tool_and_cannot_call_one(redis_url):
    async with running_stack(redis_url) as host:
        root = await host.register_root("planner", "plans", rules={"child": "allow"})
        silent = await host.register_child(root.session_id, "explore", "reads")  # no rules: no tool
        async with Client(stdio(redis_url, silent.session_id, "--run", "run-9"), cache=None) as client:
            assert (await client.list_tools()).tools == []
            with pytest.raises(MCPError, match="Unknown tool"):
                await call(client, {"to": root.handle, "body": "hi"})
        assert await accepted(host, root.session_id) == []


async def test_stdio_server_for_an_unknown_session_stops_with_one_line(redis_url):
    env = {**os.environ, "REDIS_URL": redis_url, **CHILD_ENV, **backend_env()}
    done = subprocess.run(
        [sys.executable, "-m", "treemail", "mcp", "--session", ids.uuid7()],
        env=env, capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL,
    )
    assert done.returncode == 2
    assert done.stderr.startswith("treemail: error: no session has id") and done.stderr.count("\n") == 1


# ---- streamable HTTP ---------------------------------------------------------------------------------


async def test_http_every_refusal_reaches_the_model_as_a_tool_error_with_its_stable_code(redis_url):
    async with running_stack(redis_url, max_pending_per_session=3, max_inflight_per_pair=2, max_hops=1) as host:
        r = await host.register_root("planner", "plans", rules={"child": "allow"})
        a = await host.register_child(r.session_id, "alpha", "", rules={"parent": "allow", "sibling": "allow"})
        b = await host.register_child(r.session_id, "beta", "", rules={"sibling": "allow"})
        c = await host.register_child(r.session_id, "gamma", "", rules={"parent": "allow"})
        stranger = await host.register_root("other", "another tree", rules={"*": "allow"})
        await host.start_run(r.session_id, "r-run")
        # Each sender sends from its open run (exact live sender); the stranger has none open.
        await host.start_run(a.session_id, "a-run")
        await live(host, b, c)
        tokens = {s: await host.tools.mint_token(s.session_id) for s in (r, a, b, c, stranger)}

        async with http_server(host) as url:
            async def code(sender, arguments, call_id=None) -> str | None:
                async with http_client(url, tokens[sender]) as client:
                    return error_code(await call(client, arguments, call_id))

            assert await code(a, {"to": c.handle, "body": "x", "session_id": r.session_id}) == (
                "send_message:invalid_arguments")
            # A binding without a run uses the session's open run; with none open, the send is refused.
            assert await code(stranger, {"to": r.session_id, "body": "x"}) == "send_message:sender_not_live"
            assert await code(a, {"to": c.handle, "body": ""}) == "send_message:invalid_body"
            assert await code(a, {"to": ids.uuid7(), "body": "x"}) == "send_message:unknown_session"
            assert await code(a, {"to": "nobody_12345678", "body": "x"}) == "send_message:unknown_session"
            assert await code(a, {"to": stranger.session_id, "body": "x"}) == "send_message:not_tree_peer"
            assert await code(a, {"to": a.handle, "body": "x"}) == "send_message:self_send"
            assert await code(c, {"to": b.handle, "body": "x"}) == "permission_denied"

            assert await code(a, {"to": c.handle, "body": "1"}) is None
            assert await code(a, {"to": c.handle, "body": "2"}) is None
            assert await code(a, {"to": c.handle, "body": "3"}) == "send_message:inflight_full"
            assert await code(b, {"to": c.handle, "body": "4"}) is None
            assert await code(b, {"to": c.handle, "body": "5"}) == "send_message:inbox_full"

            assert await code(a, {"to": r.handle, "body": "once"}, "k-1") is None
            assert await code(a, {"to": r.handle, "body": "other"}, "k-1") == "send_message:idempotency_conflict"

            # Hops: a's run claims r's mail (hop 0) and answers at hop 1; r's run (the token's binding has no
            # run, so each call uses r's current one) claims that, so r's next send would be hop 2 > max_hops.
            assert await code(r, {"to": a.handle, "body": "go"}) is None
            await host.claim(a.session_id, "a-run")
            assert await code(a, {"to": r.handle, "body": "done"}) is None
            await host.claim(r.session_id, "r-run")
            assert await code(r, {"to": b.handle, "body": "more"}) == "send_message:max_hops_exceeded"


async def test_http_disabled_messaging_and_no_decision_are_tool_errors_too(redis_url):
    async with running_stack(redis_url, enabled=False) as host:
        root = await host.register_root("planner", "plans", rules={"child": "allow"})
        child = await host.register_child(root.session_id, "explore", "reads")
        await live(host, root)  # only a session's open run may send (exact live sender)
        token = await host.tools.mint_token(root.session_id)
        async with http_server(host) as url, http_client(url, token) as client:
            assert error_code(await call(client, {"to": child.handle, "body": "x"})) == "send_message:disabled"

    # No worker at all: the producer's deadline passes.
    config = make_config(redis_url)
    config = config.model_copy(update={"service": config.service.model_copy(update={"decision_timeout_s": 0.5})})
    lonely = await Treemail.connect(config, redis_url)
    try:
        token = await lonely.tools.mint_token(root.session_id)
        async with http_server(lonely) as url, http_client(url, token) as client:
            assert error_code(await call(client, {"to": child.handle, "body": "x"})) == "send_message:engine_shutdown"
    finally:
        await lonely.close()


async def test_http_a_token_acts_only_as_its_session_and_run_whatever_the_request_says(redis_url):
    async with running_stack(redis_url) as host:
        root = await host.register_root("planner", "plans", rules={"child": "allow"})
        child = await host.register_child(root.session_id, "explore", "reads", rules={"parent": "allow"})
        silent = await host.register_child(root.session_id, "quiet", "no rules")
        await host.start_run(child.session_id, "child-run")  # the token's run is the child's open run
        child_token = await host.tools.mint_token(child.session_id, "child-run")
        silent_token = await host.tools.mint_token(silent.session_id)
        async with http_server(host) as url:
            async with http_client(url, child_token) as client:
                result = await client.call_tool(
                    "send_message", {"to": root.handle, "body": "from the child"},
                    meta={TOOL_CALL_META: "use-1", "session_id": root.session_id, "run_id": "forged"},
                )
                assert not result.is_error
            async with http_client(url, silent_token) as client:
                assert (await client.list_tools()).tools == []
                with pytest.raises(MCPError, match="Unknown tool"):
                    await call(client, {"to": root.handle, "body": "hi"})
        (event,) = await accepted(host, root.session_id)
        assert (event.sender_session_id, event.run_id, event.tool_call_id) == (child.session_id, "child-run", "use-1")


@pytest.mark.parametrize("mode", ["auto", "legacy"])
async def test_http_any_server_process_checks_tokens_and_a_retry_through_another_returns_the_first_message(
    redis_url, mode,
):
    async with running_stack(redis_url) as host:
        root = await host.register_root("planner", "plans", rules={"child": "allow"})
        child = await host.register_child(root.session_id, "explore", "reads")
        await live(host, root)  # the token's run is the root's open run (exact live sender)
        token = await host.tools.mint_token(root.session_id, "run-1")
        second = await Treemail.connect(make_config(redis_url), redis_url)  # another server's own host
        try:
            async with http_server(host) as url_1, http_server(second) as url_2:
                async with http_client(url_1, token, mode) as client:
                    first = await call(client, {"to": child.handle, "body": "once"}, "use-7")
                async with http_client(url_2, token, mode) as client:
                    again = await call(client, {"to": child.handle, "body": "once"}, "use-7")
        finally:
            await second.close()
        assert again.structured_content["message_id"] == first.structured_content["message_id"]
        assert len(await host.obligations.pending_mail(child.session_id)) == 1


async def test_http_token_without_a_run_sends_from_the_run_open_at_each_request(redis_url):
    # From its second request on, a token's session is read with its check: that read is the request's own,
    # never one remembered from an earlier request.
    async with running_stack(redis_url) as host:
        root = await host.register_root("planner", "plans", rules={"child": "allow"})
        child = await host.register_child(root.session_id, "explore", "reads")
        token = await host.tools.mint_token(root.session_id)
        async with http_server(host) as url, http_client(url, token) as client:
            first = await call(client, {"to": child.handle, "body": "none open"}, "c-1")
            assert error_code(first) == "send_message:sender_not_live"
            await host.start_run(root.session_id, "run-1")
            assert not (await call(client, {"to": child.handle, "body": "in run 1"}, "c-2")).is_error
            await host.finish_run(root.session_id, "run-1")
            assert error_code(await call(client, {"to": child.handle, "body": "between"}, "c-3")) == (
                "send_message:sender_not_live")
            await host.start_run(root.session_id, "run-2")
            assert not (await call(client, {"to": child.handle, "body": "in run 2"}, "c-4")).is_error
        assert [(e.run_id, e.tool_call_id) for e in await accepted(host, child.session_id)] == [
            ("run-1", "c-2"), ("run-2", "c-4")]


async def test_http_refuses_requests_without_a_valid_token_and_a_revoked_one_at_its_next_request(redis_url):
    async with running_stack(redis_url) as host:
        root = await host.register_root("planner", "plans", rules={"child": "allow"})
        child = await host.register_child(root.session_id, "explore", "reads")
        token = await host.tools.mint_token(root.session_id)
        async with http_server(host) as url:
            request = {"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": {}}
            async with httpx2.AsyncClient() as raw:
                for headers in ({}, {"Authorization": "Bearer tmk_made-up"}, {"Authorization": "Bearer " + token[:-1]}):
                    response = await raw.post(url, json=request, headers={
                        **headers, "Accept": "application/json, text/event-stream"})
                    assert response.status_code == 401

            async with http_client(url, token) as client:
                assert [t.name for t in (await client.list_tools()).tools] == ["send_message"]
                assert await host.tools.revoke_token(token) is True
                # The server answers 401 (as above); the SDK client reports it as an MCPError.
                with pytest.raises(MCPError):
                    await call(client, {"to": child.handle, "body": "after revocation"})
            with pytest.raises(ExceptionGroup) as refused:
                async with http_client(url, token) as client:
                    await client.list_tools()
            assert refused.group_contains(MCPError)
        assert await host.tools.revoke_token(token) is False
        assert await accepted(host, child.session_id) == []


async def test_http_server_process_serves_tokens_minted_elsewhere_and_stops_on_sigterm(redis_url):
    import signal
    import socket

    async with running_stack(redis_url) as host:
        root = await host.register_root("planner", "plans", rules={"child": "allow"})
        token = await host.tools.mint_token(root.session_id)
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            port = probe.getsockname()[1]
        env = {**os.environ, "REDIS_URL": redis_url, **CHILD_ENV, **backend_env()}
        process = subprocess.Popen(
            [sys.executable, "-m", "treemail", "mcp", "--http", "--port", str(port)],
            env=env, stdin=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
        )
        try:
            # It says where it listens once bound: waiting for that line, not for a fixed time, keeps a
            # slow start on a busy machine from failing the test.
            said = await asyncio.to_thread(process.stderr.readline)
            assert f"http://127.0.0.1:{port}/mcp" in said and "Bearer" in said, said
            async with http_client(f"http://127.0.0.1:{port}/mcp", token) as client:
                assert [t.name for t in (await client.list_tools()).tools] == ["send_message"]
            process.send_signal(signal.SIGTERM)
            assert await asyncio.to_thread(process.wait, 30) == 0
        finally:
            if process.poll() is None:
                process.kill()
                process.wait()
