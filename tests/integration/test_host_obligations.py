"""What survives a failing host, through the real stack: wakes without a claim as failed attempts, settlement
notices once, whatever the stop reason, the announced gate, interrupts and releases (host API -> workers -> Lua)."""

import pytest

from treemail.adapters import keys, metrics
from treemail.domain import events as ev
from treemail.host import SendContext

from .conftest import adapters, running_stack

pytestmark = pytest.mark.cluster

RULES = {"*": "allow"}
# The root may also interrupt its children (interrupt_agent).
ROOT_RULES = {"message": {"*": "allow"}, "interrupt": {"child": "allow"}}


async def tree(host, *, continuable=True):
    root = await host.register_root("planner", "plans", rules=ROOT_RULES, status="running")
    await host.start_run(root.session_id, "run-root")
    child = await host.register_child(root.session_id, "explore", "reads", rules=RULES, status="idle",
                                      continuable=continuable)
    return root, child


async def send(host, session, run_id, call, to, body="hi", mode="steer"):
    return await host.send_message(SendContext(session.session_id, run_id, call), {"to": to, "body": body, "mode": mode})


def of(events, kind):
    return [e for _, e in events if isinstance(e, kind)]


async def due_entry(host, session) -> float | None:
    record = await adapters(host).sessions.record(session.session_id)
    return await adapters(host).redis.zscore(keys.due_index(record.partition), session.session_id)


async def test_a_woken_run_that_ends_without_a_claim_is_counted_backed_off_and_shown_by_inspect(redis_url):
    async with running_stack(redis_url) as host:
        root, child = await tree(host)
        sent = await send(host, root, "run-root", "c1", child.handle, "the task")
        [wake] = [w for w in await host.wakes("runner", block_ms=2000) if w.session_id == child.session_id]
        assert await host.wake_run(wake, "run-1")

        def failed() -> float:
            return metrics.HOST_REGISTRY.get_sample_value(
                "treemail_failed_delivery_attempts_total", {"reason": "wake_unclaimed", "outcome": "released"}) or 0

        before = failed()
        await host.finish_run(child.session_id, "run-1")  # the provider failed before the first request
        assert failed() == before + 1
        status = await host.obligations.inspect(sent["message_id"])
        assert (status["status"], status["attempts"], status["reason"]) == ("accepted", 1, "wake_unclaimed")
        assert status["next_attempt_at"] > 0
        # Not woken again at once: the pump is due when the backoff ends.
        assert [w for w in await host.wakes("runner", block_ms=200) if w.session_id == child.session_id] == []
        assert abs(await due_entry(host, child) - status["next_attempt_at"]) < 1e-6
        # New mail wakes it at once all the same.
        await send(host, root, "run-root", "c2", child.handle, "more")
        assert [w for w in await host.wakes("runner", block_ms=2000) if w.session_id == child.session_id]


async def test_a_settlement_notice_names_the_child_carries_its_closing_block_and_takes_any_stop_reason(redis_url):
    async with running_stack(redis_url) as host:
        root, child = await tree(host)
        await host.inject(child.session_id, "delegation", "the task", "queue")  # the task, through treemail
        await host.start_run(child.session_id, "run-1")
        for delivery in await host.claim(child.session_id, "run-1"):
            await host.consume(child.session_id, delivery.message_id)
        closing = "Found it.\n\n- cache.py:40 stale read\n- cache.py:88 same"
        assert await host.finish_run(child.session_id, "run-1", "context_window_exceeded", closing) == "steered"
        [notice] = [d for d in await host.claim(root.session_id, "run-root") if d.owner == "settlement"]
        assert child.handle in notice.text and child.session_id in notice.text
        assert (f"Background subagent {child.handle} (session {child.session_id}) ended abnormally "
                "(reason: context_window_exceeded).") in notice.text
        assert closing in notice.text
        # Repeated, the finish neither fails nor tells the parent twice.
        assert await host.finish_run(child.session_id, "run-1", "context_window_exceeded", closing) == "steered"
        assert len(of(await host.history(child.session_id), ev.SessionSettled)) == 1
        notices = [e for e in of(await host.history(root.session_id), ev.ProducerMessageAccepted)
                   if e.owner == "settlement"]
        assert len(notices) == 1


async def test_a_child_given_its_task_directly_and_never_messaged_owes_no_notice_one_given_it_through_treemail_does(
        redis_url):
    async with running_stack(redis_url) as host:
        root, direct = await tree(host)
        through = await host.register_child(root.session_id, "review", "reviews", rules=RULES, status="idle")
        await host.inject(through.session_id, "delegation", "review cache.py", "queue")
        for child in (direct, through):
            await host.start_run(child.session_id, "run-1")
        assert await host.finish_run(direct.session_id, "run-1", "completed", "done") == "not_announced"
        assert await host.finish_run(through.session_id, "run-1", "completed", "done") == "steered"


async def test_a_host_says_a_child_given_its_task_directly_was_announced_at_registration_first_run_or_later(
        redis_url):
    """A child handed its task directly (not as treemail mail) gets a settlement notice once its host says it
    was announced; no notice for a child that never received anything."""
    async with running_stack(redis_url) as host:
        root, _ = await tree(host)
        at_registration = await host.register_child(root.session_id, "explore", "reads", rules=RULES, status="idle",
                                                    announced=True)
        with_first_run = await host.register_child(root.session_id, "review", "reviews", rules=RULES, status="idle")
        later = await host.register_child(root.session_id, "grep", "greps", rules=RULES, status="idle")
        never = await host.register_child(root.session_id, "lint", "lints", rules=RULES, status="idle")
        await host.start_run(at_registration.session_id, "run-1")
        await host.start_run(with_first_run.session_id, "run-1", announced=True)
        await host.start_run(later.session_id, "run-1")
        await host.obligations.announce(later.session_id)
        await host.obligations.announce(later.session_id)  # idempotent
        await host.start_run(never.session_id, "run-1")
        for child in (at_registration, with_first_run, later):
            assert await host.finish_run(child.session_id, "run-1", "completed", "done") == "steered"
            assert len(of(await host.history(child.session_id), ev.SessionAnnounced)) == 1
        assert await host.finish_run(never.session_id, "run-1", "completed", "done") == "not_announced"
        notices = [d for d in await host.claim(root.session_id, "run-root") if d.owner == "settlement"]
        assert sorted(d.sender_session_id for d in notices) == sorted(
            c.session_id for c in (at_registration, with_first_run, later))


async def test_a_repeated_disposal_settles_once_and_writes_one_settled_record(redis_url):
    async with running_stack(redis_url) as host:
        root, child = await tree(host)
        await send(host, root, "run-root", "c1", child.handle, "go")
        for _ in range(3):
            assert (await host.disposal.dispose(child.session_id, "aborted", "stopped early")).settlement == "steered"
        assert len(of(await host.history(child.session_id), ev.SessionSettled)) == 1
        assert len([e for e in of(await host.history(root.session_id), ev.ProducerMessageAccepted)
                    if e.owner == "settlement"]) == 1


async def test_each_run_that_ends_for_good_is_told_once_and_a_disposal_right_after_adds_nothing(redis_url):
    """Where the contract's sources disagree, chosen: a finished child woken by mail and finished again tells
    its parent again (one notice per run that ends for good); finish_run(reason) then dispose(reason) tells
    the parent once."""
    async with running_stack(redis_url) as host:
        root, child = await tree(host)
        await send(host, root, "run-root", "c1", child.handle, "go")
        await host.start_run(child.session_id, "run-1")
        assert await host.finish_run(child.session_id, "run-1", "completed", "first answer") == "steered"
        await send(host, root, "run-root", "c2", child.handle, "one more thing")  # wakes the finished child
        await host.start_run(child.session_id, "run-2")
        assert await host.finish_run(child.session_id, "run-2", "completed", "second answer") == "steered"
        disposed = await host.disposal.dispose(child.session_id, "completed")
        assert disposed.settlement == "already_told"
        notices = [e.body for e in of(await host.history(root.session_id), ev.ProducerMessageAccepted)
                   if e.owner == "settlement"]
        assert [body.rsplit("\n\n", 1)[-1] for body in notices] == ["first answer", "second answer"]
        settled = of(await host.history(child.session_id), ev.SessionSettled)
        assert [(s.run_id, s.disposed, s.notice) for s in settled] == [
            ("run-1", False, "steered"), ("run-2", False, "steered"), (None, True, "already_told")]


async def test_after_an_abort_the_childs_mail_waits_until_a_new_send_wakes_it(redis_url):
    async with running_stack(redis_url) as host:
        root, child = await tree(host)
        await host.start_run(child.session_id, "run-1")
        await send(host, root, "run-root", "c1", child.handle, "later", mode="queue")  # for the next turn
        await host.interrupts.interrupt_agent(SendContext(root.session_id, "run-root", "i1"), {"to": child.handle})
        [interrupt] = await host.interrupts.read("runner", block_ms=2000)
        assert await host.interrupts.abort_run(interrupt)
        # The abort wakes nobody, and neither does the pump (reconcile is the pump's first pass).
        assert await host.obligations.reconcile() == 0
        assert [w for w in await host.wakes("runner", block_ms=200) if w.session_id == child.session_id] == []
        await send(host, root, "run-root", "c2", child.handle, "now go on")
        [wake] = [w for w in await host.wakes("runner", block_ms=2000) if w.session_id == child.session_id]
        assert await host.wake_run(wake, "run-2")
        assert len(await host.claim(child.session_id, "run-2")) == 2  # the waiting mail, and the new


async def test_an_aborted_one_shot_child_is_finished_and_never_resumed(redis_url):
    async with running_stack(redis_url) as host:
        root, child = await tree(host, continuable=False)
        await host.start_run(child.session_id, "run-1")
        # A model cannot interrupt a one-shot child (an accepted no-op); its host can abort the run itself.
        noop = await host.interrupts.interrupt_agent(SendContext(root.session_id, "run-root", "i1"), {"to": child.handle})
        assert (noop["result"], noop["reason"]) == ("no_op", "one_shot")
        await host.finish_run(child.session_id, "run-1", "aborted")
        record = await adapters(host).sessions.record(child.session_id)
        assert (await adapters(host).store.load(record)).state.status == "finished"
        refused = await send(host, root, "run-root", "c1", child.handle, "more")
        assert refused["error"]["code"] == "send_message:not_resumable"


async def test_a_release_at_a_step_boundary_is_due_at_the_next_one_and_spends_no_attempt(redis_url):
    async with running_stack(redis_url) as host:
        root, child = await tree(host)
        await host.start_run(child.session_id, "run-1")
        sent = await send(host, root, "run-root", "c1", child.handle)
        for _ in range(12):  # more than the attempt budget
            [delivery] = await host.claim(child.session_id, "run-1")
            await host.release(child.session_id, delivery.message_id)
        status = await host.obligations.inspect(sent["message_id"])
        assert (status["status"], status["attempts"], status["reason"]) == ("accepted", 0, "released")


# ---- send versus dispose ---------------------------------------------------------------------------------------


async def test_a_send_that_loses_the_race_with_a_disposal_lands_on_the_childs_next_incarnation(redis_url):
    from treemail.domain import commands as c

    async with running_stack(redis_url) as host:
        root, child = await tree(host)
        await host.start_run(child.session_id, "run-1")
        unread = await send(host, root, "run-root", "c1", child.handle, "before the cutoff")
        await adapters(host).sessions.execute(c.DisposeSession(child.session_id, "aborted"))  # the cutoff is open
        late = await send(host, root, "run-root", "c2", child.handle, "lost the race")
        assert "message_id" in late, late  # not recipient_closing: it waits for the disposal to settle
        disposed = await host.disposal.dispose(child.session_id, "aborted")
        assert list(disposed.returned) == [unread["message_id"]]  # the mail the cutoff cut off goes back
        # Settled: the late message starts the child's next incarnation.
        [wake] = [w for w in await host.wakes("runner", block_ms=2000) if w.session_id == child.session_id]
        assert await host.wake_run(wake, "run-2")
        [delivery] = await host.claim(child.session_id, "run-2")
        assert delivery.message_id == late["message_id"]
        history = [type(e).__name__ for _, e in await host.history(child.session_id)]
        assert history.index("SessionClosed") < history.index("SessionResumed")


async def test_a_send_to_a_disposed_continuable_child_resumes_it_and_a_one_shot_one_refuses(redis_url):
    async with running_stack(redis_url) as host:
        root, child = await tree(host)
        once = await host.register_child(root.session_id, "once", "runs once", rules=RULES, status="idle",
                                         continuable=False)
        for session in (child, once):
            await host.disposal.dispose(session.session_id)
        resumed = await send(host, root, "run-root", "c1", child.handle, "one more thing")
        assert "message_id" in resumed, resumed
        [wake] = [w for w in await host.wakes("runner", block_ms=2000) if w.session_id == child.session_id]
        assert await host.wake_run(wake, "run-2")
        assert [d.message_id for d in await host.claim(child.session_id, "run-2")] == [resumed["message_id"]]
        refused = await send(host, root, "run-root", "c2", once.handle, "one more thing")
        assert refused["error"]["code"] == "send_message:recipient_closing"
        # The resumed incarnation is settled on its own: a second disposal tells the parent again.
        assert (await host.disposal.dispose(child.session_id, "completed", "done")).settlement == "steered"
