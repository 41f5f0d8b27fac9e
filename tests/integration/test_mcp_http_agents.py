"""Agents that receive over streamable HTTP (`treemail mcp --http --receive`): claims held by a lease.

The same exactly-once-into-context guarantees the stdio agents have (test_mcp_agents.py), with no connection
to hold a claim: the next call of the session confirms what the previous result showed, a lease no call
ended is released by the pump as a failed attempt (on the test clock), and consecutive requests of one agent
may be served by different server processes. Clients are the official MCP SDK over streamable HTTP.
"""

import asyncio
import contextlib
import json
import os
import signal
import socket
import subprocess
import sys

import pytest
from mcp import Client
from mcp.shared.exceptions import MCPError

from treemail.domain import events as ev
from treemail.domain.leasedruns import LEASED_RUN_PREFIX
from treemail.producers.mcp.connection import INBOX_URI

from ..conftest import backend_env
from .conftest import running_stack, timed_stack
from .test_mcp import CHILD_ENV, call, http_client, http_server, stdio
from .test_mcp_agents import of, texts, tree

pytestmark = pytest.mark.cluster


def ids_of(result) -> list[str]:
    return [m["message_id"] for m in result.structured_content["messages"]]


@pytest.mark.parametrize("mode", ["auto", "legacy"])
async def test_two_http_agents_converse_and_each_message_is_consumed_once(redis_url, mode):
    async with running_stack(redis_url) as host:
        planner, explore = await tree(host)
        tokens = [await host.tools.mint_token(s.session_id) for s in (planner, explore)]
        async with http_server(host, receive=True) as url:
            async with http_client(url, tokens[0], mode) as a, http_client(url, tokens[1], mode) as b:
                names = [t.name for t in (await b.list_tools()).tools]
                assert names == ["send_message", "check_mail", "wait_for_mail", "acknowledge_mail"]
                assert (await texts(b, "check_mail")).structured_content == {"messages": []}  # opens b's run
                sent = await call(a, {"to": explore.handle, "body": "look at cache.py"})
                assert sent.structured_content["recipient_state"] == "running"

                got = await texts(b, "check_mail")
                assert ids_of(got) == [sent.structured_content["message_id"]]
                assert got.content[0].text == (
                    f'<agent_message from="{planner.handle}">\nlook at cache.py\n\n'
                    f'[use `send_message(to="{planner.handle}", ...)` to reply]\n</agent_message>'
                )
                reply = await call(b, {"to": planner.handle, "body": "cache.py leaks on eviction"})  # confirms
                assert not reply.is_error
                waited = await texts(a, "wait_for_mail", {"timeout_s": 20})
                assert "cache.py leaks on eviction" in waited.content[0].text
                assert (await texts(a, "acknowledge_mail")).structured_content == {"acknowledged": 1}
                assert (await texts(a, "acknowledge_mail")).structured_content == {"acknowledged": 0}  # once
                assert (await texts(b, "check_mail")).structured_content == {"messages": []}

        for session in (planner, explore):
            history = await host.history(session.session_id)
            assert len(of(history, ev.ProducerMessageConsumed)) == 1
            assert of(history, ev.ProducerMessageReleased) == []
            (started,) = of(history, ev.SessionRunStarted)  # one run across all of the agent's requests
            assert started.run_id.startswith(LEASED_RUN_PREFIX)


async def test_steer_mail_rides_on_the_next_http_call_and_the_call_after_confirms_it(redis_url):
    async with running_stack(redis_url) as host:
        planner, explore = await tree(host)
        await host.start_run(planner.session_id, "planner-run")
        token = await host.tools.mint_token(explore.session_id)
        async with http_server(host, receive=True) as url, http_client(url, token) as b:
            assert (await texts(b, "check_mail")).structured_content == {"messages": []}  # opens the run
            sent = await host.send(planner.session_id, explore.handle, "stop and report")  # steer
            result = await call(b, {"to": planner.handle, "body": "working on it"})
            (riding,) = result.structured_content["agent_messages"]
            assert riding["message_id"] == sent["message_id"] and "stop and report" in result.content[1].text
            quiet = await call(b, {"to": planner.handle, "body": "still on it"})
            assert "agent_messages" not in quiet.structured_content
        consumed = of(await host.history(explore.session_id), ev.ProducerMessageConsumed)
        assert [e.message_id for e in consumed] == [sent["message_id"]]


@contextlib.asynccontextmanager
async def on_the_test_clock(redis_url: str, **messaging):
    """A stack on the test clock with 60 s leases, a planner whose run is open and the explorer it writes to."""
    async with timed_stack(redis_url, mcp_lease_s=60, **messaging) as env:
        planner, explore = await tree(env.tm)
        await env.tm.start_run(planner.session_id, "planner-run")
        yield env, planner, explore


async def test_a_client_killed_mid_claim_gets_the_message_again_when_its_lease_expires_counted_and_marked(
        redis_url):
    async with on_the_test_clock(redis_url) as (env, planner, explore):
        host = env.tm
        sent = await host.send(planner.session_id, explore.handle, "are you there?", mode="queue")
        token = await host.tools.mint_token(explore.session_id)
        async with http_server(host, receive=True) as url:
            async with http_client(url, token) as dying:
                first = await texts(dying, "check_mail")
                assert ids_of(first) == [sent["message_id"]]
            # The client is gone: no call confirms the claim, and nothing over HTTP says it went away.
            assert await env.advance(59) == []  # the lease still holds it
            released = await env.advance(1)
            assert [(type(e), e.reason) for e in released] == [(ev.ProducerMessageReleased, "attempt_timeout")]
            await env.advance(1)  # past the first attempt's backoff: due again

            async with http_client(url, token) as agent:
                again = await texts(agent, "check_mail")
                (row,) = again.structured_content["messages"]
                assert (row["message_id"], row["shown_before"]) == (sent["message_id"], 1)
                assert again.content[0].text.startswith(
                    f'<agent_message from="{planner.handle}" shown_before="1">\nare you there?')
                assert (await texts(agent, "acknowledge_mail")).structured_content == {"acknowledged": 1}

        history = await host.history(explore.session_id)
        claims = of(history, ev.ProducerMessageClaimed)
        assert [e.message_id for e in claims] == [sent["message_id"]] * 2  # the lease's end counted an attempt
        assert [e.message_id for e in of(history, ev.ProducerMessageConsumed)] == [sent["message_id"]]
        (pending,) = [e for e in of(history, ev.ProducerMessageReleased)]
        assert pending.attempts_change == 0  # the claim counted it: released as a failed attempt, not handed back


async def test_a_call_before_the_lease_ends_confirms_whatever_the_clock_says_after(redis_url):
    async with on_the_test_clock(redis_url) as (env, planner, explore):
        host = env.tm
        sent = await host.send(planner.session_id, explore.handle, "think it over", mode="queue")
        token = await host.tools.mint_token(explore.session_id)
        async with http_server(host, receive=True) as url, http_client(url, token) as agent:
            assert ids_of(await texts(agent, "check_mail")) == [sent["message_id"]]
            await env.advance(45)  # a model thinking longer than the 30 s attempt timeout, within its lease
            assert (await texts(agent, "check_mail")).structured_content == {"messages": []}
            assert await env.advance(500) == []  # confirmed: nothing left for the pump (the run lasts 600 s)
        history = await host.history(explore.session_id)
        assert [e.message_id for e in of(history, ev.ProducerMessageConsumed)] == [sent["message_id"]]
        assert of(history, ev.ProducerMessageReleased) == []


async def test_a_vanished_http_agents_run_is_finished_by_the_pump_and_its_next_call_starts_again_with_its_mail(
        redis_url):
    async with on_the_test_clock(redis_url, mcp_idle_s=600) as (env, planner, explore):
        host = env.tm
        first = await host.send(planner.session_id, explore.handle, "first task", mode="queue")
        token = await host.tools.mint_token(explore.session_id)
        async with http_server(host, receive=True) as url:
            async with http_client(url, token) as agent:
                assert ids_of(await texts(agent, "check_mail")) == [first["message_id"]]
                assert (await texts(agent, "acknowledge_mail")).structured_content == {"acknowledged": 1}
                for _ in range(3):  # an agent still calling keeps its run, however long the whole takes
                    await env.advance(250)
                    assert (await texts(agent, "check_mail")).structured_content == {"messages": []}
                run = await host.tools.mailbox.current_run(explore.session_id)
                shown = await host.send(planner.session_id, explore.handle, "second task", mode="queue")
                assert ids_of(await texts(agent, "check_mail")) == [shown["message_id"]]
            # The client is gone, holding a claim; HTTP never says so.
            await env.advance(60)  # its lease ends: released as a failed attempt
            assert await host.tools.mailbox.current_run(explore.session_id) == run  # the run is still open
            assert await env.advance(539) == []
            finished = await env.advance(1)  # 600 s after its last call
            assert [(type(e), e.run_id, e.reason) for e in finished if isinstance(e, ev.SessionRunFinished)] == [
                (ev.SessionRunFinished, run, "idle")]
            assert await host.tools.mailbox.current_run(explore.session_id) is None
            later = await host.send(planner.session_id, explore.handle, "third task")
            assert later["recipient_state"] == "queued"  # no longer running: a host may wake it

            async with http_client(url, token) as agent:  # the same agent, back: a new run, nothing lost
                again = await texts(agent, "check_mail")
                assert [(m["message_id"], m.get("shown_before")) for m in again.structured_content["messages"]] == [
                    (shown["message_id"], 1), (later["message_id"], None)]
                assert (await texts(agent, "acknowledge_mail")).structured_content == {"acknowledged": 2}
                assert (await host.tools.mailbox.current_run(explore.session_id)) not in (None, run)

        history = await host.history(explore.session_id)
        consumed = [e.message_id for e in of(history, ev.ProducerMessageConsumed)]
        assert sorted(consumed) == sorted([first["message_id"], shown["message_id"], later["message_id"]])
        assert len(consumed) == 3  # each once
        started = [e.run_id for e in of(history, ev.SessionRunStarted)]
        assert len(started) == 2 and all(r.startswith(LEASED_RUN_PREFIX) for r in started)
        renewals = of(history, ev.SessionRunRenewed)
        assert len(renewals) == 3  # the calls 250 s apart were recorded; the ones a moment apart were not


@contextlib.contextmanager
def http_process(redis_url: str):
    """A real `treemail mcp --http --receive` process on a free port; yields its URL and the process."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    env = {**os.environ, "REDIS_URL": redis_url, **CHILD_ENV, **backend_env()}
    process = subprocess.Popen([sys.executable, "-m", "treemail", "mcp", "--http", "--receive", "--port", str(port)],
                               env=env, stdin=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        said = process.stderr.readline()  # once bound, it says where it listens
        assert f"http://127.0.0.1:{port}/mcp" in said, said
        yield f"http://127.0.0.1:{port}/mcp", process
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
        try:
            process.wait(30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


async def test_two_server_processes_alternately_serve_one_agent_and_each_message_reaches_it_once(redis_url):
    async with running_stack(redis_url) as host:
        planner, explore = await tree(host)
        await host.start_run(planner.session_id, "planner-run")
        token = await host.tools.mint_token(explore.session_id)
        with http_process(redis_url) as (url_1, _), http_process(redis_url) as (url_2, _):
            seen: list[str] = []
            sent = []
            for turn in range(4):  # each request a new client on the other process: nothing shared but Valkey
                sent.append((await host.send(planner.session_id, explore.handle, f"task {turn}", mode="queue"))[
                    "message_id"])
                async with http_client((url_1, url_2)[turn % 2], token) as agent:
                    got = await texts(agent, "wait_for_mail", {"timeout_s": 10})
                    assert all("shown_before" not in m for m in got.structured_content["messages"])
                    seen += ids_of(got)
            async with http_client(url_1, token) as agent:
                assert (await texts(agent, "acknowledge_mail")).structured_content == {"acknowledged": 1}
        assert seen == sent  # each shown once, in order
        history = await host.history(explore.session_id)
        assert [e.message_id for e in of(history, ev.ProducerMessageConsumed)] == sent
        assert of(history, ev.ProducerMessageReleased) == []
        assert len({e.run_id for e in of(history, ev.SessionRunStarted)}) == 1


async def test_an_http_agent_never_takes_over_a_session_its_engine_runs(redis_url):
    async with running_stack(redis_url) as host:
        planner, explore = await tree(host)
        await host.start_run(explore.session_id, "engine-run")
        token = await host.tools.mint_token(explore.session_id)
        async with http_server(host, receive=True) as url, http_client(url, token) as agent:
            refused = await agent.call_tool("check_mail", {})
            assert refused.is_error and refused.structured_content["error"]["code"] == "mcp:engine_run"
            sent = await call(agent, {"to": planner.handle, "body": "from the engine's run"})
            assert sent.structured_content["error"]["code"] == "mcp:engine_run"
        assert await host.tools.mailbox.current_run(explore.session_id) == "engine-run"


async def test_an_http_agent_whose_session_was_disposed_reads_why_as_a_tool_error(redis_url):
    async with running_stack(redis_url) as host:
        planner, explore = await tree(host)
        token = await host.tools.mint_token(explore.session_id)
        await host.disposal.dispose(explore.session_id, "aborted")
        async with http_server(host, receive=True) as url, http_client(url, token) as agent:
            refused = await agent.call_tool("check_mail", {})
            code = refused.structured_content["error"]["code"]
            assert refused.is_error and code.startswith("lifecycle:"), code
            assert refused.content[0].text.startswith(f"{code}: ")


@pytest.mark.filterwarnings("ignore::mcp.shared.exceptions.MCPDeprecationWarning")
async def test_over_http_the_inbox_is_read_and_a_subscription_is_refused_with_the_way_to_be_told(redis_url):
    async with running_stack(redis_url) as host:
        planner, explore = await tree(host)
        await host.start_run(planner.session_id, "planner-run")
        token = await host.tools.mint_token(explore.session_id)
        sent = await host.send(planner.session_id, explore.handle, "news", mode="queue")
        async with http_server(host, receive=True) as url, http_client(url, token, "legacy") as agent:
            assert [r.uri for r in (await agent.list_resources()).resources] == [INBOX_URI]
            inbox = json.loads((await agent.read_resource(INBOX_URI)).contents[0].text)
            assert [m["message_id"] for m in inbox["messages"]] == [sent["message_id"]]
            assert "news" not in json.dumps(inbox)  # reading it delivers nothing
            with pytest.raises(MCPError, match="wait_for_mail"):
                await agent.subscribe_resource(INBOX_URI)
            assert ids_of(await texts(agent, "check_mail")) == [sent["message_id"]]


async def test_a_listen_stream_over_http_is_told_of_its_own_sessions_mail_only(redis_url):
    async with running_stack(redis_url) as host:
        planner, explore = await tree(host)
        tokens = [await host.tools.mint_token(s.session_id) for s in (planner, explore)]
        async with http_server(host, receive=True) as url, http_client(url, tokens[0]) as a, \
                http_client(url, tokens[1]) as b:
            async with a.listen(resource_subscriptions=[INBOX_URI]) as a_told, \
                    b.listen(resource_subscriptions=[INBOX_URI]) as b_told:
                a_events: list = []
                a_listening = asyncio.create_task(collect(a_told, a_events))
                sent = await call(a, {"to": explore.handle, "body": "news for b", "mode": "queue"})
                assert (await asyncio.wait_for(b_told.__anext__(), 15)).uri == INBOX_URI
                await asyncio.sleep(0.3)  # one server, one URI for every inbox: a's stream must stay quiet
                assert a_events == []
                await call(b, {"to": planner.handle, "body": "news for a", "mode": "queue"})
                await asyncio.wait_for(a_listening, 15)
            await texts(b, "acknowledge_mail")  # b's first call opened its run: the queued mail rode on its result
        consumed = of(await host.history(explore.session_id), ev.ProducerMessageConsumed)
        assert [e.message_id for e in consumed] == [sent.structured_content["message_id"]]


async def collect(stream, into: list) -> None:
    into.append(await stream.__anext__())


async def test_a_stdio_connection_and_the_http_run_of_one_session_take_over_from_each_other(redis_url):
    async with running_stack(redis_url) as host:
        planner, explore = await tree(host)
        await host.start_run(planner.session_id, "planner-run")
        sent = await host.send(planner.session_id, explore.handle, "which one of you?", mode="queue")
        token = await host.tools.mint_token(explore.session_id)
        async with http_server(host, receive=True) as url:
            async with http_client(url, token) as over_http:
                assert ids_of(await texts(over_http, "check_mail")) == [sent["message_id"]]
            http_run = await host.tools.mailbox.current_run(explore.session_id)
            # The stdio connection finishes the HTTP run (its unconfirmed claim given back) and shows it again.
            async with Client(stdio(redis_url, explore.session_id, "--receive"), cache=None) as over_stdio:
                (row,) = (await texts(over_stdio, "check_mail")).structured_content["messages"]
                assert (row["message_id"], row["shown_before"]) == (sent["message_id"], 1)
                assert (await texts(over_stdio, "acknowledge_mail")).structured_content == {"acknowledged": 1}
            async with http_client(url, token) as over_http:  # and HTTP takes the session back
                assert (await texts(over_http, "check_mail")).structured_content == {"messages": []}
        history = await host.history(explore.session_id)
        assert http_run in [e.run_id for e in of(history, ev.SessionRunFinished)]
        assert [e.message_id for e in of(history, ev.ProducerMessageConsumed)] == [sent["message_id"]]
        assert len(of(history, ev.SessionRunStarted)) == 3


async def test_http_agents_answer_in_a_thread(redis_url):
    async with running_stack(redis_url, threads=True) as host:
        planner, explore = await tree(host)
        tokens = [await host.tools.mint_token(s.session_id) for s in (planner, explore)]
        async with http_server(host, receive=True) as url, http_client(url, tokens[0]) as a, \
                http_client(url, tokens[1]) as b:
            await texts(b, "check_mail")  # opens b's run
            sent = await call(a, {"to": explore.handle, "body": "status?"})
            qid = sent.structured_content["message_id"]
            got = await texts(b, "wait_for_mail", {"timeout_s": 10})
            assert f"(message_id: {qid})" in got.content[0].text  # what the model names to answer it
            replied = await call(b, {"to": planner.handle, "body": "green", "in_reply_to": qid})
            assert not replied.is_error, replied.content[0].text
        thread = await host.history.thread(planner.session_id, qid)
        assert [r["body"] for r in thread] == ["status?", "green"]


async def _call_and_give_up(url: str, token: str, name: str, arguments: dict) -> None:
    """A ``tools/call`` whose client stops waiting for the answer after a second and closes its connection."""
    import httpx2

    body = {"jsonrpc": "2.0", "id": 7, "method": "tools/call", "params": {"name": name, "arguments": arguments}}
    headers = {"Accept": "application/json, text/event-stream", "Content-Type": "application/json",
               "mcp-protocol-version": "2025-06-18", "Authorization": f"Bearer {token}"}
    async with httpx2.AsyncClient(timeout=httpx2.Timeout(5.0, read=1.0)) as raw:
        with pytest.raises(httpx2.ReadTimeout):
            await raw.post(url, json=body, headers=headers)


@pytest.mark.parametrize("tool", ["check_mail", "send_message"])
async def test_mail_claimed_for_an_answer_its_client_never_got_is_handed_back_not_confirmed(redis_url, tool):
    async with running_stack(redis_url) as host:
        planner, explore = await tree(host)
        await host.start_run(planner.session_id, "planner-run")
        token = await host.tools.mint_token(explore.session_id)
        async with http_server(host, receive=True) as url:
            async with http_client(url, token) as opening:
                await texts(opening, "check_mail")  # opens the session's leased run
            sent = await host.send(planner.session_id, explore.handle, "only once",
                                   mode="queue" if tool == "check_mail" else "steer")
            # The claim commits, then the answer is slow (a loaded server): the client gives up and goes away.
            owner, name = (host.tools.mailbox, "claim_turn") if tool == "check_mail" else (host, "claim")
            claim, never = getattr(owner, name), asyncio.Event()

            async def claim_then_stall(*args, **kwargs):
                taken = await claim(*args, **kwargs)
                await never.wait()
                return taken

            setattr(owner, name, claim_then_stall)
            arguments = {} if tool == "check_mail" else {"to": planner.handle, "body": "status"}
            await _call_and_give_up(url, token, tool, arguments)
            for _ in range(200):  # the server sees the connection closed and cancels the request
                if of(await host.history(explore.session_id), ev.ProducerMessageReleased):
                    break
                await asyncio.sleep(0.05)
            setattr(owner, name, claim)
            # The agent calls again: the mail no answer carried is shown, not confirmed unseen.
            async with http_client(url, token) as again:
                shown = ids_of(await texts(again, "check_mail"))
                await texts(again, "acknowledge_mail")
        assert shown == [sent["message_id"]]
        history = await host.history(explore.session_id)
        assert [e.message_id for e in of(history, ev.ProducerMessageConsumed)] == [sent["message_id"]]


async def test_a_token_whose_session_is_gone_lists_no_tools_and_each_request_is_one_clear_error(redis_url, caplog):
    import logging

    from treemail.adapters import tokens

    from .conftest import adapters

    async with running_stack(redis_url) as host:
        token = await tokens.mint(adapters(host).redis, "01a20000-0000-7000-8000-000000000000")
        with caplog.at_level(logging.WARNING):
            async with http_server(host, receive=True) as url, http_client(url, token) as agent:
                assert (await agent.list_tools()).tools == []
                for request in (agent.read_resource(INBOX_URI), agent.call_tool("check_mail", {})):
                    with pytest.raises(MCPError, match="no longer exists"):
                        await request
        assert [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR] == []


async def test_a_listen_stream_whose_token_is_revoked_is_told_nothing_more(redis_url):
    async with running_stack(redis_url) as host:
        planner, explore = await tree(host)
        await host.start_run(planner.session_id, "planner-run")
        kept, revoked = [await host.tools.mint_token(explore.session_id) for _ in range(2)]
        async with http_server(host, receive=True) as url, http_client(url, kept) as a, \
                http_client(url, revoked) as b:
            await texts(b, "check_mail")
            async with a.listen(resource_subscriptions=[INBOX_URI]) as a_told, \
                    b.listen(resource_subscriptions=[INBOX_URI]) as b_told:
                b_events: list = []
                b_listening = asyncio.create_task(collect(b_told, b_events))
                await host.tools.revoke_token(revoked)
                await host.send(planner.session_id, explore.handle, "after the revoke", mode="queue")
                assert (await asyncio.wait_for(a_told.__anext__(), 15)).uri == INBOX_URI
                await asyncio.sleep(0.3)  # both streams watch the same inbox: the revoked one stays quiet
                assert b_events == []
                b_listening.cancel()
                await asyncio.gather(b_listening, return_exceptions=True)
