"""treemail.testing as an engine author uses it: its own embedded Valkey, one clock for every part, time that
moves only when the test moves it."""

import socket
from urllib.parse import urlparse

import pytest

from treemail.domain import events as ev
from treemail.host import SendContext
from treemail.testing import TestClock, TestStack


async def test_a_stack_of_its_own_dates_every_decision_by_its_clock_and_stops_its_valkey():
    async with TestStack.start(start=1_000_000.0) as env:
        tm = env.tm
        root = await tm.register_root("planner", "plans", rules={"child": "allow"}, status="running")
        child = await tm.register_child(root.session_id, "explore", "reads", rules={"parent": "allow"})
        await tm.start_run(root.session_id, "run-1")
        env.clock.advance(5)
        await tm.send_message(SendContext(root.session_id, "run-1", "call-1"), {"to": child.handle, "body": "hi"})
        [accepted] = [e for _, e in await tm.history(child.session_id) if isinstance(e, ev.ProducerMessageAccepted)]
        assert accepted.at == 1_000_005.0  # decided by the worker, dated by the test's clock
        port = urlparse(env.url).port
    with socket.socket() as probe:
        assert probe.connect_ex(("127.0.0.1", port)) != 0  # its Valkey is gone with it


def test_the_clock_never_goes_back():
    clock = TestClock(start=10.0)
    clock.advance(2.5)
    assert (clock.now(), clock.monotonic()) == (12.5, 2.5)
    with pytest.raises(ValueError, match="never goes back"):
        clock.advance(-1)


async def test_a_whole_configuration_or_messaging_keys_not_both():
    from treemail.adapters.config import Config

    with pytest.raises(ValueError, match="not both"):
        async with TestStack.start(config=Config(), max_hops=2):
            pass


async def test_the_test_clock_alone_walks_a_peer_message_through_pending_attempts_parked_retried_processed():
    """``advance`` runs every timed rule of the pump, the peer driver's included: automatic retries with
    backoff, exhaustion parks the work, a retry renews the parked budget after control authorization,
    and processed includes its settlement. Nothing here sleeps or drives a peer driver by hand."""
    async with TestStack.start(max_pending_per_session=1, peer_code_version="host-1.4.2") as env:
        tm = env.tm
        planner = await tm.register_root("planner", "plans the work", rules={})
        advisor = await tm.register_root("advisor", "reviews designs", rules={}, status="idle")
        other = await tm.register_root("planner", "another planner", rules={})
        for source, grant in ((planner, {"send": True, "read": True, "control": True}), (other, {"send": True})):
            await tm.start_run(source.session_id, "run-1")
            await tm.peers.register_route("advisor", advisor.session_id, source_session_id=source.session_id)
            await tm.peers.set_grant(advisor.session_id, source_session_id=source.session_id, **grant)
        # given the advisor's one-message inbox filled by another peer's mail
        await tm.peers.send(SendContext(other.session_id, "run-1", "call-0"), {"peer": "advisor", "body": "first"})
        await env.pump()
        # when the planner sends: stored, first attempt refused for room, still pending
        sent = await tm.peers.send(SendContext(planner.session_id, "run-1", "call-1"),
                                   {"peer": "advisor", "body": "waits for room"})
        message_id = sent["message_id"]
        assert sent["status"] == "pending"
        # then each attempt waits out its backoff on the test clock, and the eighth parks the delivery
        attempts = []
        for _ in range(10):
            status = await tm.obligations.inspect(message_id, planner.session_id)
            if status["status"] == "parked":
                break
            assert (status["status"], status["code_version"]) == ("pending", "host-1.4.2")
            attempts.append(status["attempts"])
            events = await env.advance(max(status.get("next_attempt_at", env.clock.now()) - env.clock.now(), 0))
            assert any(isinstance(e, ev.PeerAttemptStarted) for e in events)
        assert attempts == sorted(attempts) and attempts[-1] >= 7
        assert (status["attempts"], status["reason"]) == (8, "attempts: send_message:inbox_full")
        assert status["code_version"] == "host-1.4.2"  # each stored intent keeps the host's code version
        # and an hour later it is still parked: no attempt is made until a retry
        assert not [e for e in await env.advance(3600) if isinstance(e, ev.PeerAttemptStarted)]
        assert (await tm.obligations.inspect(message_id, planner.session_id))["status"] == "parked"
        # when the advisor reads its first message and the planner (control granted) retries
        await tm.start_run(advisor.session_id, "run-a")
        [first] = await tm.claim(advisor.session_id, "run-a")
        await tm.consume(advisor.session_id, first.message_id)
        renewed = await tm.obligations.retry(message_id, planner.session_id)
        assert (renewed["status"], renewed["attempts"]) == ("pending", 0)
        # then the next pass admits it, and once consumed the pass after reads it back as processed
        await env.advance(1)
        accepted = await tm.obligations.inspect(message_id, planner.session_id)
        assert (accepted["status"], accepted["code_version"]) == ("accepted", "host-1.4.2")
        [delivery] = await tm.claim(advisor.session_id, "run-a")
        assert delivery.message_id == message_id
        await tm.consume(advisor.session_id, message_id)
        settled = await env.advance(1)
        assert any(isinstance(e, ev.MessageSettled) for e in settled)
        processed = await tm.obligations.inspect(message_id, planner.session_id)
        assert (processed["status"], processed["code_version"]) == ("processed", "host-1.4.2")
        # the admitted message, made by the ninth attempt after a retry, carries it unchanged
        [admitted] = [e for _, e in await tm.history(advisor.session_id)
                      if isinstance(e, ev.ProducerMessageAccepted) and e.message_id == message_id]
        assert admitted.code_version == "host-1.4.2"
