"""The pump's sweep for mail no rule can end any more, against a real Valkey: a stream an older close left with a
message pending (no return, no resume, no due entry), written with real events through the event store, is
reported once (the event on its stream, inspect, the metric, a log line); a healthy obligation is not."""

import logging

import pytest

from consumers.pump import Pump
from treemail.adapters import keys, metrics
from treemail.domain import events as ev
from treemail.domain.commands import DisposeSession
from treemail.domain.commitplan import plan_commit
from treemail.host import SendContext
from treemail.services.population import SweepPosition

from .conftest import adapters, timed_stack


def stranded_count() -> float:
    return metrics.PUMP_REGISTRY.get_sample_value("treemail_obligations_total", {"action": "stranded"}) or 0.0


async def close_without_returning(env, record) -> None:
    """What a close that forgot the session's pending mail would have written: closing, then closed, and nothing
    for the message; with no due entry for the session (an index that never had one for this rule)."""
    store = adapters(env.tm).store
    loaded = await store.load(record)
    events = [ev.SessionClosing(at=env.clock.now(), stop_reason="completed"), ev.SessionClosed(at=env.clock.now())]
    result = await store.append(store.prepare(plan_commit(record, loaded.state, loaded.version, events), loaded))
    assert result.status == "ok"
    await adapters(env.tm).redis.zrem(keys.due_index(record.partition), record.session_id)


async def test_the_pump_reports_a_message_no_rule_can_end_once_and_leaves_a_healthy_one_alone(redis_url, caplog):
    async with timed_stack(redis_url, stranded_sweep_s=600) as env:
        tm = env.tm
        root = await tm.register_root("planner", "plans", rules={"child": "allow"}, status="running")
        await tm.start_run(root.session_id, "run-1")
        one_shot = await tm.register_child(root.session_id, "explore", "reads", continuable=False, status="running")
        healthy = await tm.register_child(root.session_id, "review", "reviews", status="idle")
        ctx = lambda n: SendContext(root.session_id, "run-1", f"call-{n}")  # noqa: E731
        stuck = (await tm.send_message(ctx(1), {"to": one_shot.handle, "body": "look", "mode": "queue"}))["message_id"]
        fine = (await tm.send_message(ctx(2), {"to": healthy.handle, "body": "review"}))["message_id"]
        await env.pump()  # the healthy child's wake, and nothing stranded yet
        assert "stranded" not in await tm.obligations.inspect(stuck)

        await close_without_returning(env, await adapters(tm).sessions.record(one_shot.session_id))
        before = stranded_count()
        # Not before the sweep's interval has passed since the first pass: the due index has no entry for it.
        early = await env.advance(599)
        assert not [e for e in early if isinstance(e, ev.ProducerMessageStranded)]
        with caplog.at_level(logging.WARNING, logger="treemail.pump"):
            reported = await env.advance(1)
        assert [(type(e).__name__, e.message_id, e.reason) for e in reported
                if isinstance(e, ev.ProducerMessageStranded)] == [("ProducerMessageStranded", stuck,
                                                                   "closed_for_good")]
        assert stranded_count() == before + 1
        assert any(stuck in r.getMessage() and "can no longer end" in r.getMessage() for r in caplog.records)
        status = await tm.obligations.inspect(stuck)
        assert (status["status"], status["stranded"]) == ("accepted", "closed_for_good")
        assert "stranded" not in await tm.obligations.inspect(fine)

        # Reported once: later sweeps find it reported already. A cancel then ends it.
        again = await env.advance(600)
        assert not [e for e in again if isinstance(e, ev.ProducerMessageStranded)]
        assert stranded_count() == before + 1
        assert (await tm.obligations.cancel(stuck))["outcome"] == "cancelled"
        assert (await tm.obligations.inspect(stuck))["status"] == "processed"


@pytest.mark.cluster
async def test_a_look_for_stranded_mail_reads_a_slice_a_pass_and_still_reports_every_message_once(redis_url):
    """Sessions stay registered for good, so the look reads a bounded slice of their states a pass and goes on at
    the next: within a partition (a set too large to answer whole) and from partition to partition."""
    async with timed_stack(redis_url, stranded_sweep_s=600) as env:
        tm = env.tm
        root = await tm.register_root("planner", "plans", rules={"child": "allow"}, status="running")
        await tm.start_run(root.session_id, "run-1")
        one_shot = await tm.register_child(root.session_id, "explore", "reads", continuable=False, status="running")
        for n in range(140):  # past the 128 members a set answers whole
            await tm.register_child(root.session_id, "review", f"reviews part {n}", status="idle")
        for n in range(6):
            await tm.register_root("planner", f"plans {n}", status="idle")
        population = 1 + 1 + 140 + 6
        stuck = (await tm.send_message(SendContext(root.session_id, "run-1", "call-1"),
                                       {"to": one_shot.handle, "body": "look", "mode": "queue"}))["message_id"]
        await env.pump()
        await close_without_returning(env, await adapters(tm).sessions.record(one_shot.session_id))

        pump = Pump(adapters(tm).store, env.config, clock=env.clock)
        pump.stranded_slice = 10
        # The pump: its look spreads over passes at one clock reading, reports the message once, and the next
        # look waits its interval from the end of this one.
        reported, positions = [], []
        while True:
            events = await pump.run_pass()
            positions.append(pump.stranded_from)
            reported += [e.message_id for e in events if isinstance(e, ev.ProducerMessageStranded)]
            if pump.stranded_from is None:
                break
        assert reported == [stuck]
        assert pump.stranded_sweep_at == env.clock.now() + 600
        assert not [e for e in await pump.run_pass() if isinstance(e, ev.ProducerMessageStranded)]

        # The service's slices: each reads about its budget, together they read every session once, and the
        # message reported already is not reported again.
        position, slices = SweepPosition(), []
        while position is not None:
            swept, position = await pump.service.sweep_stranded(position, budget=10)
            slices.append((swept.looked, position, swept.events))
        assert sum(looked for looked, _, _ in slices) == population
        assert max(looked for looked, _, _ in slices) < population
        assert any(p is not None and p.cursor != 0 for _, p, _ in slices)  # went on inside one partition
        # A slice of one session ends at each partition holding any: it goes on from partition to partition.
        position, partitions = SweepPosition(), set()
        while position is not None:
            position = (await pump.service.sweep_stranded(position, budget=1))[1]
            partitions.add(position and position.partition)
        assert len(partitions - {None}) > 1
        assert [e for _, _, events in slices for e in events] == []
        assert [p for _, p, _ in slices] == positions  # the pump's passes went on slice by slice

        # The whole look at once (``budget`` None) reads every session in one slice, and finds it reported.
        whole, after = await pump.service.sweep_stranded()
        assert (whole.looked, whole.sessions, after, whole.events) == (population, 1, None, [])


def completed_count() -> float:
    return metrics.PUMP_REGISTRY.get_sample_value("treemail_obligations_total", {"action": "disposal_completed"}) or 0.0


@pytest.mark.cluster
async def test_the_pump_completes_a_disposal_its_host_left_after_the_cutoff_so_its_mail_ends(redis_url, caplog):
    async with timed_stack(redis_url, stranded_sweep_s=600) as env:
        tm = env.tm
        root = await tm.register_root("planner", "plans", rules={"child": "allow"}, status="running")
        child = await tm.register_child(root.session_id, "explore", "reads", rules={"parent": "allow"}, status="idle")
        await tm.start_run(root.session_id, "run-1")
        ctx = lambda n: SendContext(root.session_id, "run-1", f"call-{n}")  # noqa: E731
        cut_off = (await tm.send_message(ctx(1), {"to": child.handle, "body": "before the cutoff"}))["message_id"]
        # The host dies right after the disposal's cutoff: the one step it took.
        record = await adapters(tm).sessions.record(child.session_id)
        await adapters(tm).sessions.execute(DisposeSession(child.session_id, "aborted", None), record)
        held = (await tm.send_message(ctx(2), {"to": child.handle, "body": "for the next incarnation"}))["message_id"]
        before = completed_count()
        # A disposal under way is its host's to finish: a look within the grace leaves it closing.
        await env.advance(599)
        assert (await adapters(tm).store.load(record)).state.disposal == "closing"
        with caplog.at_level(logging.WARNING, logger="treemail.pump"):
            await env.advance(601)
        assert completed_count() == before + 1
        assert any(child.session_id in r.getMessage() and "completing the disposal" in r.getMessage()
                   for r in caplog.records)
        history = [type(e).__name__ for _, e in await tm.history(child.session_id)]
        assert history.count("SessionClosed") == 1 and history[-1] != "SessionClosing"
        # What the disposal cut off went back to its sender with a notice; the held message resumed the session
        # and waits for its next incarnation's run, as when the host completes a disposal itself.
        returned = await tm.obligations.inspect(cut_off)
        assert (returned["status"], returned["settlement"]["outcome"]) == ("processed", "discarded")
        assert [e for _, e in await tm.history(root.session_id)
                if isinstance(e, ev.ProducerMessageAccepted) and e.owner == "returned"]
        assert "SessionResumed" in history and (await tm.obligations.inspect(held))["status"] == "accepted"
        # Once: later looks find it closed.
        await env.advance(1200)
        assert completed_count() == before + 1
