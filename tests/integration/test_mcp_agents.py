"""Agents that speak only MCP: two of them converse through treemail with no engine code.

Each agent is a real `treemail mcp --receive` child process driven by the MCP SDK's own client; the
workers deciding the sends are the running_stack's. The host here only registers the sessions and
reads their histories to check what the agents did.
"""

import asyncio
import base64
import json
import os
import subprocess
import sys

import pytest
from mcp import Client
from mcp import types
from mcp.shared.exceptions import MCPError

from treemail.domain import events as ev
from treemail.host import SendContext
from treemail.producers.mcp.connection import INBOX_URI, RUN_PREFIX, Connection

from ..conftest import backend_env
from .conftest import running_stack
from .test_mcp import call, stdio

# Delivery, threads and reads run the same on a 3-master cluster (a tree's keys share one slot).
pytestmark = pytest.mark.cluster

RECEIVE = "--receive"


def of(history, cls) -> list:
    return [e for _, e in history if isinstance(e, cls)]


async def tree(host):
    planner = await host.register_root("planner", "plans", rules={"child": "allow"}, status="idle")
    explore = await host.register_child(planner.session_id, "explore", "reads the code", rules={"parent": "allow"},
                                        status="idle")
    return planner, explore


async def texts(client: Client, name: str, arguments: dict | None = None):
    result = await client.call_tool(name, arguments or {})
    assert not result.is_error, result.content[0].text
    return result


@pytest.mark.parametrize("mode", ["auto", "legacy"])
async def test_two_mcp_only_agents_converse_and_each_message_is_consumed_once(redis_url, mode):
    async with running_stack(redis_url) as host:
        planner, explore = await tree(host)
        async with Client(stdio(redis_url, planner.session_id, RECEIVE), cache=None, mode=mode) as a, \
                Client(stdio(redis_url, explore.session_id, RECEIVE), cache=None, mode=mode) as b:
            names = [t.name for t in (await b.list_tools()).tools]
            assert names == ["send_message", "check_mail", "wait_for_mail", "acknowledge_mail"]

            sent = await call(a, {"to": explore.handle, "body": "look at cache.py"})
            assert sent.structured_content["recipient_state"] == "running"  # connected means running

            got = await texts(b, "check_mail")
            (message,) = got.structured_content["messages"]
            assert message["message_id"] == sent.structured_content["message_id"]
            # The envelope an engine's model sees, reply hint included.
            assert got.content[0].text == (
                f'<agent_message from="{planner.handle}">\nlook at cache.py\n\n'
                f'[use `send_message(to="{planner.handle}", ...)` to reply]\n</agent_message>'
            )

            # The reply is b's next call: it confirms what check_mail handed out.
            reply = await call(b, {"to": planner.handle, "body": "cache.py leaks on eviction"})
            assert not reply.is_error
            waited = await texts(a, "wait_for_mail", {"timeout_s": 20})
            assert "cache.py leaks on eviction" in waited.content[0].text
            assert (await texts(a, "acknowledge_mail")).structured_content == {"acknowledged": 1}
            assert (await texts(b, "check_mail")).structured_content == {"messages": []}

        for session in (planner, explore):
            history = await host.history(session.session_id)
            assert len(of(history, ev.ProducerMessageConsumed)) == 1
            assert of(history, ev.ProducerMessageReleased) == []
            # Gone means idle: the connection's run ended with it.
            started, finished = of(history, ev.SessionRunStarted), of(history, ev.SessionRunFinished)
            assert [s.run_id for s in started] == [f.run_id for f in finished]
            assert started[0].run_id.startswith(RUN_PREFIX)


async def test_a_connection_dropped_mid_claim_gets_the_message_back_once(redis_url):
    async with running_stack(redis_url) as host:
        planner, explore = await tree(host)
        await host.start_run(planner.session_id, "planner-run")
        sent = await host.send(planner.session_id, explore.handle, "summarise the diff", mode="queue")
        async with Client(stdio(redis_url, explore.session_id, RECEIVE), cache=None) as b:
            first = await texts(b, "check_mail")
            assert [m["message_id"] for m in first.structured_content["messages"]] == [sent["message_id"]]
            # The connection drops here: the claim is never confirmed.

        history = await host.history(explore.session_id)
        (released,) = of(history, ev.ProducerMessageReleased)
        assert released.message_id == sent["message_id"]
        assert (await host.tools.mailbox.current_run(explore.session_id)) is None  # gone means idle

        async with Client(stdio(redis_url, explore.session_id, RECEIVE), cache=None) as b:
            again = await texts(b, "check_mail")
            assert [m["message_id"] for m in again.structured_content["messages"]] == [sent["message_id"]]
            assert (await texts(b, "check_mail")).structured_content == {"messages": []}  # confirmed, once

        history = await host.history(explore.session_id)
        assert [e.message_id for e in of(history, ev.ProducerMessageClaimed)] == [sent["message_id"]] * 2
        assert [e.message_id for e in of(history, ev.ProducerMessageConsumed)] == [sent["message_id"]]


async def test_a_result_no_call_followed_is_shown_again_to_each_next_connection_marked_as_a_repeat(redis_url):
    async with running_stack(redis_url) as host:
        planner, explore = await tree(host)
        await host.start_run(planner.session_id, "planner-run")
        async with Client(stdio(redis_url, explore.session_id, RECEIVE), cache=None) as b:
            sent = await host.send(planner.session_id, explore.handle, "stop and report")  # steer
            first = await call(b, {"to": planner.handle, "body": "working on it"})
            assert first.content[1].text.startswith(f'<agent_message from="{planner.handle}">\n')  # news
            assert "shown_before" not in first.structured_content["agent_messages"][0]
            # The connection ends cleanly here: no later call confirmed that the model read the result.

        for times in (1, 2):
            async with Client(stdio(redis_url, explore.session_id, RECEIVE), cache=None) as b:
                again = await texts(b, "check_mail")
                (row,) = again.structured_content["messages"]
                assert (row["message_id"], row["shown_before"]) == (sent["message_id"], times)
                assert again.content[0].text.startswith(
                    f'<agent_message from="{planner.handle}" shown_before="{times}">\nstop and report')
                if times == 2:
                    assert (await texts(b, "acknowledge_mail")).structured_content == {"acknowledged": 1}

        history = await host.history(explore.session_id)
        assert [e.message_id for e in of(history, ev.ProducerMessageClaimed)] == [sent["message_id"]] * 3
        assert [e.message_id for e in of(history, ev.ProducerMessageConsumed)] == [sent["message_id"]]


async def test_a_dead_connection_is_taken_over_and_can_no_longer_send(redis_url):
    async with running_stack(redis_url) as host:
        planner, explore = await tree(host)
        async with Client(stdio(redis_url, explore.session_id, RECEIVE), cache=None) as old:
            await texts(old, "check_mail")
            async with Client(stdio(redis_url, explore.session_id, RECEIVE), cache=None) as new:
                refused = await call(old, {"to": planner.handle, "body": "from the past"})
                assert refused.structured_content["error"]["code"] == "send_message:sender_not_live"
                assert (await old.call_tool("check_mail", {})).structured_content["error"]["code"] == "mcp:superseded"
                assert not (await call(new, {"to": planner.handle, "body": "from now"})).is_error


async def test_steer_mail_rides_on_the_result_of_the_next_tool_call(redis_url):
    async with running_stack(redis_url) as host:
        planner, explore = await tree(host)
        await host.start_run(planner.session_id, "planner-run")
        async with Client(stdio(redis_url, explore.session_id, RECEIVE), cache=None) as b:
            sent = await host.send(planner.session_id, explore.handle, "stop and report")  # steer
            result = await call(b, {"to": planner.handle, "body": "working on it"})
            assert result.structured_content["mode"] == "steer"  # the tool's own fields are unchanged
            assert "stop and report" in result.content[1].text
            # In the structured result too, as check_mail's rows: a client may read only that form.
            (riding,) = result.structured_content["agent_messages"]
            assert riding["message_id"] == sent["message_id"] and riding["text"] == result.content[1].text
            assert result.meta["treemail/delivered"] == [sent["message_id"]]
            # Without mail the structured result is the tool's own, nothing added.
            quiet = await call(b, {"to": planner.handle, "body": "still on it"})
            assert "agent_messages" not in quiet.structured_content and len(quiet.content) == 1
        consumed = of(await host.history(explore.session_id), ev.ProducerMessageConsumed)
        assert [e.message_id for e in consumed] == [sent["message_id"]]


async def test_a_message_with_images_shows_them_to_the_agent_in_each_form_before_it_counts_as_read(redis_url):
    png = base64.b64encode(b"\x89PNG\r\n\x1a\n" + bytes(32)).decode()
    blocks = [{"type": "text", "text": "the chart:"}, {"type": "image", "media_type": "image/png", "data": png},
              {"type": "image", "url": "https://example.com/trend.png"}]
    async with running_stack(redis_url, content_blocks=True) as host:
        planner = await host.register_root("planner", "plans", rules={"child": "allow"}, status="idle")
        explore = await host.register_child(planner.session_id, "explore", "reads", rules={"parent": "allow"},
                                            status="idle", accepts_images=True)
        await host.start_run(planner.session_id, "planner-run")
        async with Client(stdio(redis_url, explore.session_id, RECEIVE), cache=None) as b:
            queued = await host.send_message(SendContext(planner.session_id, "planner-run", "c1"),
                                             {"to": explore.handle, "body": blocks, "mode": "queue"})
            got = await b.call_tool("check_mail", {})
            # The image as image content after the text, the URL image named with its address; the same in the
            # structured rows, for a client that reads only those.
            assert [c.type for c in got.content] == ["text", "image", "text"]
            assert (got.content[1].data, got.content[1].mime_type) == (png, "image/png")
            assert got.content[2].text == "[image 2]: https://example.com/trend.png"
            (row,) = got.structured_content["messages"]
            assert [(i.get("data"), i.get("url")) for i in row["images"]] == [
                (png, None), (None, "https://example.com/trend.png")]
            # Steer mail riding on another tool's result carries its images the same way.
            steered = await host.send_message(SendContext(planner.session_id, "planner-run", "c2"),
                                              {"to": explore.handle, "body": blocks[:2]})
            result = await call(b, {"to": planner.handle, "body": "looking"})
            assert [c.type for c in result.content] == ["text", "text", "image"]
            assert result.structured_content["agent_messages"][0]["images"][0]["data"] == png
            await b.call_tool("acknowledge_mail", {})
        consumed = of(await host.history(explore.session_id), ev.ProducerMessageConsumed)
        assert [e.message_id for e in consumed] == [queued["message_id"], steered["message_id"]]


async def test_mail_to_a_disconnected_agent_queues_and_asks_for_a_wake(redis_url):
    async with running_stack(redis_url) as host:
        planner, explore = await tree(host)
        async with Client(stdio(redis_url, explore.session_id, RECEIVE), cache=None):
            pass
        await host.start_run(planner.session_id, "planner-run")
        sent = await host.send(planner.session_id, explore.handle, "when you are back")
        assert sent["recipient_state"] == "queued"
        wakes = await host.wakes("test-runner", count=10, block_ms=2000)
        assert explore.session_id in [w.session_id for w in wakes]


# ---- told when mail arrives: the inbox resource ----------------------------------------------------


@pytest.mark.filterwarnings("ignore::mcp.shared.exceptions.MCPDeprecationWarning")
async def test_legacy_subscription_to_the_inbox_is_told_when_mail_arrives(redis_url):
    async with running_stack(redis_url) as host:
        planner, explore = await tree(host)
        await host.start_run(planner.session_id, "planner-run")
        updated = asyncio.Event()

        async def on_message(message) -> None:
            if isinstance(message, types.ResourceUpdatedNotification) and message.params.uri == INBOX_URI:
                updated.set()

        async with Client(stdio(redis_url, explore.session_id, RECEIVE), cache=None, mode="legacy",
                          message_handler=on_message) as b:
            assert [r.uri for r in (await b.list_resources()).resources] == [INBOX_URI]
            await b.subscribe_resource(INBOX_URI)
            await asyncio.sleep(0.3)
            assert not updated.is_set()  # nothing waits yet
            sent = await host.send(planner.session_id, explore.handle, "news")
            await asyncio.wait_for(updated.wait(), 15)
            inbox = json.loads((await b.read_resource(INBOX_URI)).contents[0].text)
            assert [m["message_id"] for m in inbox["messages"]] == [sent["message_id"]]
            assert "news" not in json.dumps(inbox)  # reading the resource delivers nothing
            got = await texts(b, "check_mail")
            assert got.structured_content["messages"][0]["message_id"] == sent["message_id"]


async def test_listen_stream_on_the_inbox_is_told_when_mail_arrives(redis_url):
    async with running_stack(redis_url) as host:
        planner, explore = await tree(host)
        await host.start_run(planner.session_id, "planner-run")
        async with Client(stdio(redis_url, explore.session_id, RECEIVE), cache=None) as b:
            async with b.listen(resource_subscriptions=[INBOX_URI]) as subscription:
                sent = await host.send(planner.session_id, explore.handle, "news")
                event = await asyncio.wait_for(subscription.__anext__(), 15)
                assert event.uri == INBOX_URI
            got = await texts(b, "check_mail")
            assert got.structured_content["messages"][0]["message_id"] == sent["message_id"]


async def test_an_unknown_tool_call_hands_out_no_mail(redis_url):
    async with running_stack(redis_url) as host:
        planner, explore = await tree(host)
        await host.start_run(planner.session_id, "planner-run")
        async with Client(stdio(redis_url, explore.session_id, RECEIVE), cache=None) as b:
            sent = await host.send(planner.session_id, explore.handle, "steer me")
            with pytest.raises(MCPError, match="Unknown tool"):
                await b.call_tool("no_such_tool", {})
            got = await texts(b, "check_mail")  # the message was not lost in the refused call's result
            assert [m["message_id"] for m in got.structured_content["messages"]] == [sent["message_id"]]


def one_line_refusal(url: str, *args: str) -> str:
    env = {**os.environ, "REDIS_URL": url, **backend_env()}
    done = subprocess.run([sys.executable, "-m", "treemail", "mcp", *args], env=env, capture_output=True, text=True,
                          timeout=60, stdin=subprocess.DEVNULL)
    assert done.returncode == 2 and done.stderr.count("\n") == 1, done.stderr
    return done.stderr


async def test_a_session_its_engine_runs_is_never_taken_over(redis_url):
    async with running_stack(redis_url) as host:
        planner, explore = await tree(host)
        await host.start_run(explore.session_id, "engine-run")
        refused = one_line_refusal(redis_url, "--session", explore.session_id, RECEIVE)
        assert f"mcp:engine_run: session {explore.session_id} is run by its engine" in refused
        assert await host.tools.mailbox.current_run(explore.session_id) == "engine-run"


async def test_a_connection_still_open_confirms_its_claims_before_they_expire(redis_url):
    # In process: the connection as `treemail mcp --receive` holds it, without the transport.
    async with running_stack(redis_url) as host:
        planner, explore = await tree(host)
        await host.start_run(planner.session_id, "planner-run")
        connection = Connection(host, explore.session_id)
        await connection.open()
        try:
            sent = await host.send(planner.session_id, explore.handle, "think about it", mode="queue")
            taken = await connection.receive("check_mail", {})
            handed = [m["message_id"] for m in taken["messages"]]
            assert handed == [sent["message_id"]]
            # What the keeper does at KEEP_AT of the claim timeout, while the agent is still thinking.
            assert await connection.keep(handed) == 1
            assert await connection.keep(handed) == 0  # once
            consumed = of(await host.history(explore.session_id), ev.ProducerMessageConsumed)
            assert [e.message_id for e in consumed] == handed
            assert (await connection.receive("acknowledge_mail", {})) == {"acknowledged": 0}
        finally:
            await connection.close()
