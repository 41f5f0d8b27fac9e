"""Flow control through the real stack on the controllable clock: a fast producer against a slow consumer
honours retry_after_ms (nothing dropped silently, retries counted); steer mail queued at its deadline under a run
that never reaches a boundary, and when its run ends first (host API -> workers -> Lua -> pump)."""

import asyncio

import pytest

from bench.backpressure import producer_against_consumer
from treemail.adapters import metrics
from treemail.domain import events as ev
from treemail.host import SendContext

from treemail.consumers.pump import Pump

from .conftest import adapters, live, make_config, running_stack, timed_stack

pytestmark = pytest.mark.cluster


async def test_a_fast_producer_honouring_retry_after_against_a_slow_consumer_drops_nothing(redis_url):
    async with timed_stack(redis_url, max_pending_per_session=3, max_inflight_per_pair=0,
                           retry_after_fallback_ms=700) as env:
        # Five sends a second against two reads a second, for 8 s: the inbox fills and stays full.
        flow = await producer_against_consumer(env, 8.0, produce_every=0.2, consume_every=0.5)
        # The same tool call again, long after, on an empty inbox: the recorded answer, wait and occupancy included.
        first = flow.refused_calls[0]
        again = await env.tm.send_message(SendContext(flow.sender, "run-p", f"send-{first}"),
                                          {"to": flow.to, "body": f"item {first}"})
        assert again == {"error": flow.refused[0]}
    accepted, refused = len(flow.accepted), len(flow.refused)
    assert flow.attempts == accepted + refused and flow.silent == 0  # every attempt answered with an id or a code
    assert sorted(flow.consumed) == sorted(flow.accepted)  # and every accepted one read
    # Each refusal was retried once its wait had passed (the last one perhaps after the producer stopped).
    assert refused >= 5 and refused - 1 <= flow.retries <= refused
    assert {e["code"] for e in flow.refused} == {"send_message:inbox_full"}
    assert all(e["occupancy"] == {"pending": 3, "limit": 3} for e in flow.refused)
    assert all(e["message"].endswith(f"(retry after {e['retry_after_ms'] / 1000:.1f} s: 3 of 3 pending)")
               for e in flow.refused)
    # The first refusal came before any pace was seen (the fallback); then the consumer's own half second.
    assert flow.refused[0]["retry_after_ms"] == 700
    assert {e["retry_after_ms"] for e in flow.refused[2:]} == {500}
    assert flow.retries_accepted >= refused - 1


def fell_back(events, message_id):
    return [e for e in events if isinstance(e, ev.ProducerMessageSteerFellBack) and e.message_id == message_id]


async def stream(tm, session) -> list:
    return [e for _, e in await tm.history(session.session_id)]


async def test_steer_mail_under_a_run_that_never_reaches_a_boundary_is_queued_at_its_deadline(redis_url, calls):
    async with timed_stack(redis_url, steer_deadline_s=10) as env:
        tm = env.tm
        root = await tm.register_root("planner", "plans", rules={"child": "allow"}, status="running")
        await tm.start_run(root.session_id, "run-1")
        child = await tm.register_child(root.session_id, "explore", "reads", rules={"parent": "allow"},
                                        status="running")
        await tm.start_run(child.session_id, "run-1")  # its first model request never returns
        sent = await tm.send_message(calls.ctx(root.session_id), {"to": child.handle, "body": "stop and report"})
        counted = metrics.PUMP_REGISTRY.get_sample_value("treemail_steer_fallbacks_total", {"reason": "deadline"})

        assert fell_back(await env.advance(9), sent["message_id"]) == []
        # Two pumps race at the deadline: the message falls back once.
        other = Pump(adapters(tm).store, env.config, clock=env.clock)
        env.clock.advance(1.5)
        mine, theirs = await asyncio.gather(env.pump(), other.service.step())
        [queued] = fell_back([*mine, *theirs.events], sent["message_id"])
        assert (queued.reason, queued.run_id, queued.waited_s) == ("deadline", "run-1", 10.5)
        assert metrics.PUMP_REGISTRY.get_sample_value(
            "treemail_steer_fallbacks_total", {"reason": "deadline"}) == counted + 1
        status = await tm.obligations.inspect(sent["message_id"], root.session_id)  # the sender can see it
        assert (status["status"], status["reason"]) == ("accepted", "steer_deadline")
        assert fell_back(await stream(tm, child), sent["message_id"]) == [queued]
        assert await env.advance(30) == []  # decided once

        # Not at a later boundary of the run it waited in: at the next run start, as queued mail.
        assert await tm.claim(child.session_id, "run-1") == []
        await tm.finish_run(child.session_id, "run-1")
        await tm.start_run(child.session_id, "run-2")
        [delivery] = await tm.claim(child.session_id, "run-2")
        assert delivery.message_id == sent["message_id"] and "stop and report" in delivery.text


async def test_steer_mail_a_run_ends_without_taking_is_queued_on_the_record_for_the_next_run(redis_url, calls):
    async with timed_stack(redis_url) as env:  # no deadline configured: the run's end still says what happened
        tm = env.tm
        root = await tm.register_root("planner", "plans", rules={"child": "allow"}, status="running")
        await tm.start_run(root.session_id, "run-1")
        child = await tm.register_child(root.session_id, "explore", "reads", rules={"parent": "allow"},
                                        status="running")
        await tm.start_run(child.session_id, "run-1")
        sent = await tm.send_message(calls.ctx(root.session_id), {"to": child.handle, "body": "one more thing"})
        counted = metrics.HOST_REGISTRY.get_sample_value("treemail_steer_fallbacks_total", {"reason": "run_finished"})
        await tm.finish_run(child.session_id, "run-1")
        [queued] = fell_back(await stream(tm, child), sent["message_id"])
        assert (queued.reason, queued.run_id) == ("run_finished", "run-1")
        assert metrics.HOST_REGISTRY.get_sample_value(
            "treemail_steer_fallbacks_total", {"reason": "run_finished"}) == counted + 1
        assert (await tm.obligations.inspect(sent["message_id"]))["reason"] == "steer_run_finished"
        # Woken like queued mail; the new run takes it as its input, not as a failed attempt of the old one.
        [wake] = [w for w in await tm.wakes("runner", block_ms=2000) if w.session_id == child.session_id]
        assert await tm.wake_run(wake, "run-2")
        [delivery] = await tm.claim(child.session_id, "run-2")
        assert delivery.message_id == sent["message_id"]
        assert (await tm.obligations.inspect(sent["message_id"]))["attempts"] == 1


async def test_racing_workers_refuse_a_full_inbox_exactly_each_refusal_with_its_wait_and_occupancy(redis_url):
    config = make_config(redis_url, max_pending_per_session=5, max_inflight_per_pair=0, retry_after_fallback_ms=900)
    # Each sender's commands on its own stream, so the two workers decide on the one recipient at once.
    config = config.model_copy(update={"service": config.service.model_copy(update={"route_commands_by": "sender"})})
    async with running_stack(redis_url, workers=2, config=config) as tm:
        root = await tm.register_root("planner", "plans", rules={"child": "allow"}, status="running")
        kids = [await tm.register_child(root.session_id, "explore", "reads", rules={"sibling": "allow"},
                                        status="running") for _ in range(4)]
        target, senders = kids[0], [root, *kids[1:]]
        await live(tm, *senders)
        answers = await asyncio.gather(*(
            tm.send_message(SendContext(s.session_id, "run-1", f"call-{n}"), {"to": target.handle, "body": f"{n}"})
            for s in senders for n in range(6)))
    accepted = [a for a in answers if "message_id" in a]
    refused = [a["error"] for a in answers if "error" in a]
    assert len(accepted) == 5 and len(refused) == 19
    assert all(e["code"] == "send_message:inbox_full" and e["occupancy"] == {"pending": 5, "limit": 5}
               and e["retry_after_ms"] == 900 and e["message"].endswith("(retry after 0.9 s: 5 of 5 pending)")
               for e in refused)
