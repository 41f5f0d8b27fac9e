"""Faults: an MCP-only agent's server process killed (-9) while it holds a claim; the message comes back once."""

import contextlib
import os
import signal
from pathlib import Path

import pytest
from mcp import Client

from tests.integration.conftest import running_stack
from tests.integration.test_mcp import stdio
from tests.integration.test_mcp_agents import RECEIVE, of, texts, tree
from treemail.domain import events as ev

pytestmark = pytest.mark.slow


def servers_for(session_id: str) -> list[int]:
    """The `treemail mcp` processes serving this session (children of the test's client)."""
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        with contextlib.suppress(OSError):
            cmdline = (proc / "cmdline").read_bytes().split(b"\0")
            if b"mcp" in cmdline and session_id.encode() in cmdline and RECEIVE.encode() in cmdline:
                found.append(int(proc.name))
    return found


async def test_a_killed_connection_is_taken_over_and_its_claim_comes_back_once(redis_url):
    async with running_stack(redis_url) as host:
        planner, explore = await tree(host)
        await host.start_run(planner.session_id, "planner-run")
        sent = await host.send(planner.session_id, explore.handle, "are you there?", mode="queue")
        with contextlib.suppress(Exception):  # the client sees its server vanish
            async with Client(stdio(redis_url, explore.session_id, RECEIVE), cache=None) as dying:
                first = await texts(dying, "check_mail")
                assert [m["message_id"] for m in first.structured_content["messages"]] == [sent["message_id"]]
                (pid,) = servers_for(explore.session_id)
                os.kill(pid, signal.SIGKILL)
        # Killed, it never finished its run: the session still looks connected, its claim still held.
        dead_run = await host.tools.mailbox.current_run(explore.session_id)
        assert dead_run is not None
        assert of(await host.history(explore.session_id), ev.ProducerMessageReleased) == []

        async with Client(stdio(redis_url, explore.session_id, RECEIVE), cache=None) as agent:
            again = await texts(agent, "check_mail")
            assert [m["message_id"] for m in again.structured_content["messages"]] == [sent["message_id"]]
            assert (await texts(agent, "check_mail")).structured_content == {"messages": []}

        history = await host.history(explore.session_id)
        finished = [e.run_id for e in of(history, ev.SessionRunFinished)]
        assert dead_run in finished  # taken over: the dead connection's run was finished by the next one
        assert [e.message_id for e in of(history, ev.ProducerMessageConsumed)] == [sent["message_id"]]
        assert [e.message_id for e in of(history, ev.ProducerMessageReleased)] == [sent["message_id"]]


async def test_an_http_server_killed_after_showing_mail_loses_nothing_the_lease_holds_the_claim(redis_url):
    # The lease, not the process, holds the claim: the next request, on another process, confirms it.
    from tests.integration.test_mcp import http_client
    from tests.integration.test_mcp_http_agents import http_process, ids_of

    async with running_stack(redis_url) as host:
        planner, explore = await tree(host)
        await host.start_run(planner.session_id, "planner-run")
        sent = await host.send(planner.session_id, explore.handle, "are you there?", mode="queue")
        token = await host.tools.mint_token(explore.session_id)
        with http_process(redis_url) as (url_1, process_1), http_process(redis_url) as (url_2, _):
            async with http_client(url_1, token) as agent:
                assert ids_of(await texts(agent, "check_mail")) == [sent["message_id"]]
            process_1.kill()
            process_1.wait()
            async with http_client(url_2, token) as agent:
                assert (await texts(agent, "check_mail")).structured_content == {"messages": []}  # confirmed it
        history = await host.history(explore.session_id)
        assert [e.message_id for e in of(history, ev.ProducerMessageConsumed)] == [sent["message_id"]]
        assert of(history, ev.ProducerMessageReleased) == []
