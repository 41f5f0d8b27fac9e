"""Scale-out and faults: send_message never raises, whatever the server does.

A send waiting on a person survives server restarts (graceful, and kill -9
that loses the request itself); a send whose server dies mid-send answers
send_message:engine_shutdown, and one waiting on a person whose server is
gone ends at its approval deadline.
"""

import asyncio
import time

import pytest

from treemail.adapters.embedded import LocalValkey
from treemail.host import SendContext, Treemail

from .helpers import WorkerPool, code, config_for

ASK = {"parent": "allow", "sibling": "ask"}


def with_service(config, **service):
    return config.model_copy(update={"service": config.service.model_copy(update=service)})


async def approve_whatever_is_asked(host, stop: asyncio.Event) -> int:
    """A person at the CLI: approves every pending request, through any outage."""
    approved = 0
    while not stop.is_set():
        try:
            for request in await host.permissions.pending_approvals():
                await host.permissions.approve(request["request_id"])
                approved += 1
        except Exception:  # noqa: BLE001 - the server is down: the person tries again
            pass
        await asyncio.sleep(0.1)
    return approved


@pytest.mark.slow
@pytest.mark.expected_duration_s(20)
@pytest.mark.parametrize("kill", [False, True], ids=["restart", "kill -9"])
async def test_a_send_waiting_on_an_approval_survives_a_server_restart(kill):
    server = LocalValkey(durable=True).start()
    try:
        config = with_service(config_for(server.url, decision_timeout_s=5), approval_timeout_s=60)
        async with WorkerPool(server.url) as pool:
            await pool.start(1)
            host = await Treemail.connect(config, server.url)
            try:
                root = await host.register_root("planner", "x", rules={"child": "allow"})
                a = await host.register_child(root.session_id, "explore", "a", rules=ASK)
                b = await host.register_child(root.session_id, "review", "b", rules=ASK)
                await host.start_run(a.session_id, "run-1")  # only a session's open run may send (exact live sender)
                await asyncio.sleep(1.2)  # everysec: the sessions are on disk; the request will not be
                send = asyncio.ensure_future(host.send_message(SendContext(a.session_id, "run-1", "call-1"),
                                                               {"to": b.handle, "body": "may I?"}))
                while not await host.permissions.pending_approvals():
                    await asyncio.sleep(0.02)
                # kill -9 right after the request: it may be lost with the last second of the AOF.
                await asyncio.to_thread(server.stop, kill)
                await asyncio.sleep(0.3)
                assert not send.done()
                await asyncio.to_thread(server.start)
                stop = asyncio.Event()
                person = asyncio.ensure_future(approve_whatever_is_asked(host, stop))
                result = await asyncio.wait_for(send, 30)
                stop.set()
                assert await person >= 1
                assert "message_id" in result, result
                accepted = [e for _, e in await host.history(b.session_id)
                            if type(e).__name__ == "ProducerMessageAccepted"]
                assert [e.message_id for e in accepted] == [result["message_id"]]
            finally:
                await host.close()
    finally:
        server.cleanup()


@pytest.mark.slow
@pytest.mark.expected_duration_s(10)
async def test_send_message_answers_rather_than_raises_when_the_server_goes_away_mid_send():
    server = LocalValkey(durable=False).start()
    host = None
    try:
        config = with_service(config_for(server.url, decision_timeout_s=1.5), approval_timeout_s=1.5,
                              connect_attempts=1)
        host = await Treemail.connect(config, server.url)  # no worker: every send waits for its decision
        root = await host.register_root("planner", "x", rules={"child": "allow"})
        a = await host.register_child(root.session_id, "explore", "a", rules=ASK)
        b = await host.register_child(root.session_id, "review", "b", rules=ASK)
        waiting = asyncio.ensure_future(host.send_message(SendContext(root.session_id, "run-1", "mid"),
                                                          {"to": a.handle, "body": "x"}))
        await asyncio.sleep(0.3)  # the command is in its stream; its decision never comes
        server.stop(kill=True)
        started = time.monotonic()
        assert code(await waiting) == "send_message:engine_shutdown"
        assert time.monotonic() - started < 5
        # A send made while the server is gone: refused at XADD.
        down = await host.send_message(SendContext(root.session_id, "run-1", "down"), {"to": a.handle, "body": "x"})
        assert code(down) == "send_message:engine_shutdown"
        assert "unreachable" in down["error"]["message"]
        # A sender this host has not sent for yet: its tree's stream is looked up first, which fails the same way.
        unseen = await host.send_message(SendContext(b.session_id, "run-1", "unseen"), {"to": a.handle, "body": "x"})
        assert code(unseen) == "send_message:engine_shutdown"
        assert "unreachable" in unseen["error"]["message"]
        # An `ask` send whose approval wait meets a dead server ends at its approval deadline or sooner.
        asked = await host.send_message(SendContext(a.session_id, "run-1", "ask"), {"to": b.handle, "body": "x"})
        assert code(asked) in ("send_message:engine_shutdown", "send_message:approval_timeout")
    finally:
        if host is not None:
            await host.close()  # never raises either, server or not
        server.cleanup()
