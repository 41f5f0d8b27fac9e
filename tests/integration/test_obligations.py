"""Delivery as an obligation through the real stack: attempt timeouts, parking, inspect, retry,
the delivery pump (lost wakes, two pumps racing), per-source capacity with worker processes, programmatic
sends with their own idempotency keys."""

import asyncio
import collections

import pytest

from treemail.adapters import compact, keys
from treemail.adapters.connection import connect
from treemail.adapters.eventstore import EventStore
from treemail.domain import events as ev
from treemail.consumers.pump import Pump
from treemail.domain.errors import LifecycleError
from treemail.host import SendContext

from .conftest import (
    adapters, close_host, connect_host, live, make_config, running_stack, timed_stack, worker_processes,
)

pytestmark = pytest.mark.cluster

def code(result):
    return result.get("error", {}).get("code")


async def family(host, child_status="running", children=1):
    root = await host.register_root("planner", "plans", rules={"child": "allow"}, status="running")
    kids = [await host.register_child(root.session_id, "explore", "reads", rules={"parent": "allow", "sibling": "allow"},
                                      status=child_status) for _ in range(children)]
    await live(host, root)  # only a session's open run may send (exact live sender)
    return root, kids


def of_type(history, cls, message_id=None):
    return [e for _, e in history if isinstance(e, cls) and (message_id is None or e.message_id == message_id)]


async def test_a_claim_never_acknowledged_is_released_after_the_timeout_and_delivered_again(redis_url, calls):
    async with timed_stack(redis_url) as env:  # the defaults: attempt timeout 30 s, first backoff 1 s
        host = env.tm
        root, [child] = await family(host)
        await host.start_run(child.session_id, "run-1")
        sent = await host.send_message(calls.ctx(root.session_id), {"to": child.handle, "body": "anyone?"})
        [first] = await host.claim(child.session_id, "run-1")
        # The host never consumes nor releases it (its model request hung).
        assert await env.advance(29) == []  # within the attempt timeout: still the host's
        [released] = await env.advance(2)
        assert isinstance(released, ev.ProducerMessageReleased) and released.reason == "attempt_timeout"
        assert await host.claim(child.session_id, "run-1") == []  # the backoff after a failed attempt
        env.clock.advance(1)
        [again] = await host.claim(child.session_id, "run-1")
        assert again.message_id == first.message_id == sent["message_id"]
        status = await host.obligations.inspect(sent["message_id"])
        assert (status["status"], status["attempts"], status["reason"]) == ("accepted", 2, "attempt_timeout")
        await host.consume(child.session_id, again.message_id)
        assert (await host.obligations.inspect(sent["message_id"]))["status"] == "processed"


async def test_a_message_failed_eight_times_is_parked_inspectable_and_retry_brings_it_back(redis_url, calls):
    async with timed_stack(redis_url) as env:  # backoff 1 s doubling to 60 s, 8 attempts
        host = env.tm
        root, [child] = await family(host)
        await host.start_run(child.session_id, "run-1")
        sent = await host.send_message(calls.ctx(root.session_id), {"to": child.handle, "body": "fragile"})
        message_id = sent["message_id"]
        # A release at a step boundary is not a failure: it never spends the budget, and the host's reason
        # is the latest one.
        for step in range(3):
            [delivery] = await host.claim(child.session_id, "run-1")
            await host.release(child.session_id, delivery.message_id, reason=f"step {step} cut short")
            assert (await host.obligations.inspect(message_id))["reason"] == f"step {step} cut short"
        for attempt in range(8):  # each run claims it and ends without acknowledging it
            [delivery] = await host.claim(child.session_id, f"run-{attempt + 1}")
            await host.finish_run(child.session_id, f"run-{attempt + 1}")
            await host.start_run(child.session_id, f"run-{attempt + 2}")
            env.clock.advance(60)  # past its backoff
        assert await host.claim(child.session_id, "run-9") == []
        status = await host.obligations.inspect(message_id, caller_session_id=root.session_id)
        assert (status["status"], status["reason"], status["attempts"]) == ("parked", "max_attempts", 8)
        assert status["receipt"]["recipient_session_id"] == child.session_id
        # The recipient, a stranger to the sender's record, may not retry it; the sender may.
        assert code(await host.obligations.retry(message_id, caller_session_id=child.session_id)) == "permission_denied"
        renewed = await host.obligations.retry(message_id, caller_session_id=root.session_id)
        assert (renewed["status"], renewed["attempts"], renewed["reason"]) == ("accepted", 0, "retried")
        [back] = await host.claim(child.session_id, "run-9")
        assert back.message_id == message_id
        # Not parked any more: nothing to retry. Processed: it can never be rewound.
        assert code(await host.obligations.retry(message_id)) == "retry_message:not_parked"
        await host.consume(child.session_id, message_id)
        assert code(await host.obligations.retry(message_id)) == "retry_message:settled"
        kinds = [type(e).__name__ for e in of_type(await host.history(child.session_id), ev.MessageEvent, message_id)]
        assert kinds.count("ProducerMessageParked") == 1 and kinds.count("ProducerMessageRetried") == 1


async def test_a_release_with_an_unbounded_reason_is_refused_and_stores_nothing(redis_url, calls):
    async with timed_stack(redis_url) as env:
        host = env.tm
        root, [child] = await family(host)
        await host.start_run(child.session_id, "run-1")
        await host.send_message(calls.ctx(root.session_id), {"to": child.handle, "body": "x"})
        [delivery] = await host.claim(child.session_id, "run-1")
        before = await host.history(child.session_id)
        with pytest.raises(LifecycleError) as refused:
            await host.release(child.session_id, delivery.message_id, reason="Traceback\n" + "x" * 300)
        assert refused.value.code == "lifecycle:invalid_reason"
        assert await host.history(child.session_id) == before


async def test_a_delivery_deadline_parks_a_message_a_day_later_without_waiting_a_day(redis_url, calls):
    async with timed_stack(redis_url) as env:  # delivery_deadline_s: 86400
        host = env.tm
        root, [child] = await family(host, child_status="idle")
        sent = await host.send_message(calls.ctx(root.session_id), {"to": child.handle, "body": "for later"})
        # Nobody ever runs the child: the pump asks to wake it again and again, then parks it at the deadline.
        before = [e for _ in range(23) for e in await env.advance(3600)]  # 23 hours
        assert not any(isinstance(e, ev.ProducerMessageParked) for e in before)
        assert any(isinstance(e, ev.SessionWakeRequested) for e in before)  # asked again as each went stale
        assert (await host.obligations.inspect(sent["message_id"]))["status"] == "accepted"
        parked = await env.advance(3600)  # the 24th
        assert [(type(e), e.reason) for e in parked if isinstance(e, ev.ProducerMessageParked)] == [
            (ev.ProducerMessageParked, "deadline")]
        status = await host.obligations.inspect(sent["message_id"])
        assert (status["status"], status["reason"]) == ("parked", "deadline")


async def test_inspect_answers_the_sender_its_controllers_and_the_host_only(redis_url, calls):
    async with running_stack(redis_url, max_pending_per_session=1) as host:
        root, [a, b] = await family(host, children=2)
        grandchild = await host.register_child(a.session_id, "grep", "x", rules={"parent": "allow"})
        await live(host, grandchild, b)
        sent = await host.send_message(calls.ctx(grandchild.session_id), {"to": a.handle, "body": "from below"})
        message_id = sent["message_id"]
        for caller in (grandchild.session_id, a.session_id, root.session_id, None):
            assert (await host.obligations.inspect(message_id, caller))["status"] == "accepted", caller
        assert code(await host.obligations.inspect(message_id, b.session_id)) == "permission_denied"
        assert code(await host.obligations.inspect("0190a000-0000-7000-8000-00000000dead")) == "message:unknown"
        receipt = (await host.obligations.inspect(message_id))["receipt"]
        assert (receipt["recipient_session_id"], receipt["recipient_state"]) == (a.session_id, "running")
        assert receipt["position"] == next(seq for seq, e in await host.history(a.session_id)
                                           if isinstance(e, ev.ProducerMessageAccepted))
        # A definite refusal stays inspectable under the id its error carries.
        refused = await host.send_message(calls.ctx(b.session_id), {"to": a.handle, "body": "no room"})
        assert code(refused) == "send_message:inbox_full"
        status = await host.obligations.inspect(refused["error"]["message_id"], b.session_id)
        assert (status["status"], status["reason"]) == ("refused", "send_message:inbox_full")
        assert code(await host.obligations.retry(refused["error"]["message_id"])) == "retry_message:settled"
        # Discarded: processed, with its (bounded) reason.
        await host.discard(a.session_id, message_id, "out of scope")
        status = await host.obligations.inspect(message_id, grandchild.session_id)
        assert status["status"] == "processed"
        assert status["settlement"]["outcome"] == "discarded" and status["reason"] == "out of scope"


async def test_the_outbound_index_points_at_the_senders_record_and_entries_written_as_copies_still_read(
        redis_url, calls):
    async with running_stack(redis_url) as host:
        root, [child] = await family(host)
        sent = await host.send_message(calls.ctx(root.session_id), {"to": child.handle, "body": "hi"})
        message_id, partition = sent["message_id"], (await adapters(host).sessions.record(root.session_id)).partition
        index = keys.outbound_index(partition)
        sent_field, _ = compact.outbound_fields(message_id)
        sender_id, position = compact.decode_outbound(await adapters(host).redis.hget(index, sent_field))
        [record] = [e for seq, e in await host.history(root.session_id) if seq == position]
        assert sender_id == root.session_id and isinstance(record, ev.MessageSent)
        assert record.message_id == message_id
        # What an earlier version wrote: "<sender> <position>" under the message id as text.
        await adapters(host).redis.hdel(index, sent_field)
        await adapters(host).redis.hset(index, message_id, f"{root.session_id} {position}")
        status = await host.obligations.inspect(message_id, root.session_id)
        assert (status["status"], status["receipt"]["position"]) == ("accepted", record.position)
        # What an earlier release wrote: the record's fields as JSON, settled as well.
        await adapters(host).redis.hset(index, mapping={
            message_id: '{"sender":"%s","recipient":"%s","status":"accepted","position":7,'
                        '"recipient_state":"idle","at":1.0}' % (root.session_id, child.session_id),
            f"{message_id}:settled": '{"outcome":"discarded","reason":"old","at":2.0}'})
        status = await host.obligations.inspect(message_id, root.session_id)
        assert (status["status"], status["receipt"]["position"], status["settlement"]["reason"]) == (
            "processed", 7, "old")


async def test_a_lost_wake_trigger_is_recovered_by_the_pump(redis_url, calls):
    async with timed_stack(redis_url) as env:
        host = env.tm
        root, [child] = await family(host, child_status="idle")
        sent = await host.send_message(calls.ctx(root.session_id), {"to": child.handle, "body": "wake up"})
        record = await adapters(host).sessions.record(child.session_id)
        # The trigger is lost (a runner read it and died for good, an operator trimmed the stream...).
        await adapters(host).redis.xtrim(keys.wake_stream(record.partition), maxlen=0)
        assert await host.wakes("runner", block_ms=100) == []
        assert await env.pump() == []  # not stale yet: a runner may still be starting the run
        renewed = await env.advance(env.config.messaging.attempt_timeout_s + 1)
        assert [type(e) for e in renewed] == [ev.SessionWakeRequested]  # asked again, once
        [wake] = await host.wakes("runner", block_ms=100)
        assert wake.session_id == child.session_id
        assert await host.wake_run(wake, "run-woken")
        [delivery] = await host.claim(child.session_id, "run-woken")
        assert delivery.message_id == sent["message_id"]


async def test_two_pumps_racing_double_nothing(redis_url, calls):
    async with timed_stack(redis_url, max_inflight_per_pair=0) as env:
        host, timeout = env.tm, env.config.messaging.attempt_timeout_s
        root, kids = await family(host, children=6)
        sleepers = [await host.register_child(root.session_id, "idle", "x", status="idle") for _ in range(4)]
        for kid in kids:
            await host.start_run(kid.session_id, "run-1")
            for n in range(3):
                await host.send_message(calls.ctx(root.session_id), {"to": kid.handle, "body": f"#{n}"})
            await host.claim(kid.session_id, "run-1")  # claimed, never acknowledged
        for sleeper in sleepers:
            await host.send_message(calls.ctx(root.session_id), {"to": sleeper.handle, "body": "wake"})
        config = adapters(host).config
        clients = [await connect(redis_url, config.service) for _ in range(2)]
        racing = [Pump(EventStore(client, config.service), config, clock=env.clock) for client in clients]
        try:
            for _ in range(4):  # several attempt timeouts: claims expire, wakes go stale again and again
                env.clock.advance(timeout + 1)
                await asyncio.gather(*(pump.service.step() for pump in racing))
        finally:
            for client in clients:
                await client.aclose()
        for kid in kids:
            history = await host.history(kid.session_id)
            per_message = collections.Counter(e.message_id for e in of_type(history, ev.ProducerMessageReleased))
            # Each message was claimed once, so it is released exactly once, whoever got there first.
            assert sorted(per_message.values()) == [1, 1, 1], per_message
        for sleeper in sleepers:
            times = [e.at for e in of_type(await host.history(sleeper.session_id), ev.SessionWakeRequested)]
            # Re-requested as each went stale, never twice for one stale wake.
            assert len(times) >= 2
            gaps = [b - a for a, b in zip(times, times[1:])]
            assert min(gaps) >= timeout, gaps


async def test_source_capacity_holds_exactly_with_several_worker_processes(redis_url):
    messaging = {"max_outstanding_per_source": 5, "max_inflight_per_pair": 0, "max_pending_per_session": 1000}
    config = make_config(redis_url, **messaging)
    async with worker_processes(redis_url, 3, **messaging):
        host = await connect_host(config, redis_url)
        try:
            root, kids = await family(host, children=6)
            jobs = [(SendContext(root.session_id, "run-1", f"call-{n}"), {"to": kids[n % 6].handle, "body": str(n)})
                    for n in range(40)]
            # Every tool call arrives twice at once, as a retrying host would send it.
            results = await asyncio.gather(*(host.send_message(ctx, args) for ctx, args in jobs for _ in range(2)))
            codes = collections.Counter(code(r) or "ok" for r in results)
            assert codes == {"ok": 10, "send_message:source_capacity": 70}, codes
            accepted = [e for kid in kids for e in of_type(await host.history(kid.session_id),
                                                           ev.ProducerMessageAccepted)]
            assert len(accepted) == 5
            sender = await host.history(root.session_id)
            assert len(of_type(sender, ev.MessageSent)) == 5 and len(of_type(sender, ev.MessageRefused)) == 35
            # A processed message frees exactly one slot.
            first = accepted[0]
            recipient = next(k for k in kids if any(e.message_id == first.message_id for e in accepted))
            await host.discard(recipient.session_id, first.message_id, "done")
            more = await asyncio.gather(*(host.send_message(SendContext(root.session_id, "run-1", f"late-{n}"),
                                                            {"to": kids[0].handle, "body": "x"}) for n in range(4)))
            assert sorted(code(r) or "ok" for r in more) == ["ok"] + ["send_message:source_capacity"] * 3
        finally:
            await close_host(host)


async def test_a_programmatic_send_with_its_own_idempotency_key_is_delivered_once(stack):
    root, [child] = await family(stack)
    first = await stack.send(root.session_id, child.handle, "report ready", idempotency_key="build-42")
    again = await stack.send(root.session_id, child.handle, "report ready", idempotency_key="build-42")
    assert first == again and "message_id" in first
    other = await stack.send(root.session_id, child.handle, "something else", idempotency_key="build-42")
    assert code(other) == "send_message:idempotency_conflict"
    unkeyed = [await stack.send(root.session_id, child.handle, "ping") for _ in range(2)]
    assert unkeyed[0]["message_id"] != unkeyed[1]["message_id"]
    accepted = of_type(await stack.history(child.session_id), ev.ProducerMessageAccepted)
    assert len(accepted) == 3
    with pytest.raises(ValueError):
        await stack.send(root.session_id, child.handle, "x", idempotency_key="")
    # By default from the sender's open run (exact live sender): with none open, the send is refused.
    await stack.finish_run(root.session_id, "run-1")
    assert code(await stack.send(root.session_id, child.handle, "late")) == "send_message:sender_not_live"


async def test_the_model_facing_tools_answer_for_the_calling_session_only(stack, calls):
    from treemail.producers.tools import message as message_tools

    root, [a, b] = await family(stack, children=2)
    await live(stack, a)
    sent = await stack.send_message(calls.ctx(a.session_id), {"to": root.handle, "body": "done"})
    assert message_tools.tool_definition("inspect_message")["input_schema"]["required"] == ["message_id"]
    mine = await message_tools.handle(stack.obligations, "inspect_message", calls.ctx(a.session_id),
                                      {"message_id": sent["message_id"]})
    assert mine["status"] == "accepted" and mine["receipt"]["recipient_session_id"] == root.session_id
    # A sibling may not see it, whatever the arguments say (here as the model's raw JSON text).
    theirs = await message_tools.handle(stack.obligations, "inspect_message", calls.ctx(b.session_id),
                                        '{"message_id": "%s"}' % sent["message_id"])
    assert code(theirs) == "permission_denied"
    bad = await message_tools.handle(stack.obligations, "retry_message", calls.ctx(a.session_id),
                                     {"message_id": sent["message_id"], "to": "x"})
    assert code(bad) == "send_message:invalid_arguments"
    not_parked = await message_tools.handle(stack.obligations, "retry_message", calls.ctx(a.session_id),
                                            {"message_id": sent["message_id"]})
    assert code(not_parked) == "retry_message:not_parked"
    assert "accepted" in message_tools.render(mine) and "permission_denied" in message_tools.render(theirs)


async def test_the_cli_functions_print_the_status_or_fail_in_one_line(stack, calls):
    from treemail.producers.host import obligations as inspection

    root, [child] = await family(stack)
    sent = await stack.send_message(calls.ctx(root.session_id), {"to": child.handle, "body": "x"})
    text = await inspection.cli_inspect(stack.obligations, sent["message_id"])
    assert text.splitlines()[0] == f"{sent['message_id']}  accepted"
    # What the accepted event records of it: its number in the pair and its chain (it starts its own).
    # (and its trace, when another test of this process turned tracing on)
    assert any(line.startswith(f"  number 1, chain {sent['message_id']}") for line in text.splitlines())
    assert '"status": "accepted"' in await inspection.cli_inspect(stack.obligations, sent["message_id"], as_json=True)
    with pytest.raises(LookupError, match="^retry_message:not_parked: "):
        await inspection.cli_retry(stack.obligations, sent["message_id"])
    with pytest.raises(LookupError, match="^message:unknown: "):
        await inspection.cli_inspect(stack.obligations, "no-such-message")


async def test_a_stranger_gets_permission_denied_from_every_partition_and_every_call(stack, calls):
    root = await stack.register_root("planner", "plans", rules={"child": "allow"})
    child = await stack.register_child(root.session_id, "explore", "reads", rules={}, status="idle")
    await stack.start_run(root.session_id, "run-1")
    sent = await stack.send_message(calls.ctx(root.session_id), {"to": child.handle, "body": "work"})
    partitions = adapters(stack).config.service.partitions
    here = keys.partition_of(root.session_id, partitions)
    strangers = {}
    for _ in range(200):
        other = await stack.register_root("critic", "reviews", rules={})
        strangers.setdefault(keys.partition_of(other.root_session_id, partitions) == here, other)
        if len(strangers) == 2:
            break
    assert set(strangers) == {True, False}
    for same_partition, stranger in strangers.items():
        for call in (stack.obligations.inspect, stack.obligations.cancel, stack.obligations.retry):
            answer = await call(sent["message_id"], stranger.session_id)
            assert code(answer) == "permission_denied", (call.__name__, same_partition, answer)
        assert code(await stack.obligations.inspect("0190a000-0000-7000-8000-00000000dead",
                                                    stranger.session_id)) == "message:unknown"
    assert (await stack.obligations.inspect(sent["message_id"], root.session_id))["status"] == "accepted"
