"""Revert and fork on a real Valkey: mail follows the session's log, and live state equals a full replay."""

from dataclasses import replace

import pytest

from treemail.adapters.eventstore import EventStore
from treemail.domain import events as ev
from treemail.domain import state as sm
from treemail.domain.errors import LifecycleError
from treemail.projections.replay import rebuild
from treemail.projections.runner import ProjectionRunner
from treemail.projections.views import PROJECTIONS
from treemail.adapters.viewstore import load_view

from .conftest import Calls, adapters, live, running_stack, timed_stack

pytestmark = pytest.mark.cluster


def code(result):
    return result.get("error", {}).get("code")


async def tree_of(host, child_status="running"):
    root = await host.register_root("planner", "plans", rules={"*": "allow"}, status="running")
    child = await host.register_child(root.session_id, "explore", "reads", rules={"*": "allow"}, status=child_status)
    await live(host, root)  # only a session's open run may send (exact live sender)
    return root, child


async def send(host, calls, sender, to, body, mode="steer", run_id="run-1"):
    result = await host.send_message(calls.ctx(sender.session_id, run_id), {"to": to, "body": body, "mode": mode})
    assert "message_id" in result, result
    return result["message_id"]


async def assert_live_equals_replay(host, session_ids):
    """The stored snapshot and pending-mail hash of each session equal a fold of its whole stream."""
    for session_id in session_ids:
        record = await adapters(host).sessions.record(session_id)
        loaded = await adapters(host).store.load(record)
        history = await adapters(host).store.read(record)
        mail: dict[str, sm.MailItem] = {}
        for seq, event in history:
            mail = sm.evolve_mail(mail, event, seq)
        assert loaded.state == sm.fold(e for _, e in history), session_id
        assert loaded.version == history[-1][0]
        assert await adapters(host).store.load_mail(record) == mail, session_id


async def live_views(host):
    out = {}
    for p in range(adapters(host).config.service.partitions):
        for name in PROJECTIONS:
            out[(name, p)] = dict((await load_view(adapters(host).redis, p, name))[0])
    return out


async def test_revert_makes_mail_claimed_or_consumed_after_the_cut_due_again_and_keeps_later_mail(stack, calls):
    root, child = await tree_of(stack)
    await stack.start_run(child.session_id, "run-1")
    first = await send(stack, calls, root, child.handle, "first")
    [delivery] = await stack.claim(child.session_id, "run-1")
    await stack.consume(child.session_id, delivery.message_id)
    cut = await stack.history.position(child.session_id)
    second = await send(stack, calls, root, child.handle, "second")
    third = await send(stack, calls, root, child.handle, "third")
    claimed = await stack.claim(child.session_id, "run-1")
    await stack.consume(child.session_id, claimed[0].message_id)  # "second" consumed after the cut

    due_again = await stack.history.revert(child.session_id, cut)

    assert sorted(due_again) == sorted([second, third])
    pending = [m.message_id for m in await stack.obligations.pending_mail(child.session_id)]
    assert pending == [second, third]  # accepted after the cut: not lost; first stays consumed
    assert first not in pending
    await stack.start_run(child.session_id, "run-2")
    assert [d.message_id for d in await stack.claim(child.session_id, "run-2")] == [second, third]
    await assert_live_equals_replay(stack, [root.session_id, child.session_id])
    # Its sender sees it unsettled again: the settlement predates the record the revert wrote.
    assert (await stack.obligations.inspect(second))["status"] == "accepted"
    assert (await stack.obligations.inspect(first))["status"] == "processed"


async def test_revert_wakes_an_idle_session_whose_mail_is_due_again(stack, calls):
    root, child = await tree_of(stack)
    await stack.start_run(child.session_id, "run-1")
    cut = await stack.history.position(child.session_id)
    await send(stack, calls, root, child.handle, "look at cache.py")
    [delivery] = await stack.claim(child.session_id, "run-1")
    await stack.consume(child.session_id, delivery.message_id)
    await stack.finish_run(child.session_id, "run-1")
    assert await stack.wakes("runner-1", block_ms=200) == []  # nothing due

    await stack.history.revert(child.session_id, cut)

    [wake] = await stack.wakes("runner-1", block_ms=2000)
    assert wake.session_id == child.session_id
    assert await stack.wake_run(wake, "run-2")
    [again] = await stack.claim(child.session_id, "run-2")
    assert again.message_id == delivery.message_id and "look at cache.py" in again.text


async def wakes_of(host, session_id: str) -> int:
    return sum(isinstance(e, ev.SessionWakeRequested) for _, e in await host.history(session_id))


async def test_restored_mail_that_no_run_takes_parks_at_its_deadline_and_an_expired_one_expires(redis_url, calls):
    async with timed_stack(redis_url) as env:
        tm = env.tm
        root = await tm.register_root("planner", "plans", rules={"*": "allow"}, status="running")
        child = await tm.register_child(root.session_id, "explore", "x", rules={"*": "allow"}, status="idle")
        await tm.start_run(root.session_id, "run-1")
        mark = await tm.history.position(child.session_id)
        plain = (await tm.send_message(calls.ctx(root.session_id), {"to": child.handle, "body": "task"}))
        expiring = (await tm.send(root.session_id, child.handle, "soon stale", expires_in_s=60,
                                  run_id="run-1"))["message_id"]
        await tm.start_run(child.session_id, "run-c")
        for delivery in await tm.claim(child.session_id, "run-c"):
            await tm.consume(child.session_id, delivery.message_id)
        await tm.finish_run(child.session_id, "run-c")
        await env.advance(3600)
        await tm.history.revert(child.session_id, mark)
        # No run ever takes them: each ends by the rules every message has, the wakes for them stop.
        for _ in range(3 * 24):
            await env.advance(3600)
        ended = {m: await tm.obligations.inspect(m) for m in (plain["message_id"], expiring)}
        assert (ended[plain["message_id"]]["status"], ended[plain["message_id"]]["reason"]) == ("parked", "deadline")
        assert (ended[expiring]["status"], ended[expiring]["settlement"]["reason"]) == ("processed", "expired")
        wakes = await wakes_of(tm, child.session_id)
        for _ in range(24):
            await env.advance(3600)
        assert await wakes_of(tm, child.session_id) == wakes


async def test_restored_mail_fills_the_pair_window_and_the_inbox_again(redis_url, calls):
    async with running_stack(redis_url, max_inflight_per_pair=1) as host:
        root, child = await tree_of(host)
        await host.start_run(child.session_id, "run-1")
        cut = await host.history.position(child.session_id)
        await send(host, calls, root, child.handle, "one")
        [delivery] = await host.claim(child.session_id, "run-1")
        await host.consume(child.session_id, delivery.message_id)
        await send(host, calls, root, child.handle, "two")  # the window had room again
        [second] = await host.claim(child.session_id, "run-1")
        await host.consume(child.session_id, second.message_id)

        await host.history.revert(child.session_id, cut)

        refused = await host.send_message(calls.ctx(root.session_id), {"to": child.handle, "body": "three"})
        assert code(refused) == "send_message:inflight_full"


async def test_revert_to_a_position_on_a_reverted_branch_or_outside_the_history_changes_nothing(stack, calls):
    root, child = await tree_of(stack)
    cut = await stack.history.position(child.session_id)
    await stack.start_run(child.session_id, "run-1")
    on_branch = await stack.history.position(child.session_id)
    await stack.history.revert(child.session_id, cut)
    before = await stack.history(child.session_id)

    for position in (0, before[-1][0] + 1, on_branch):
        with pytest.raises(LifecycleError) as caught:
            await stack.history.revert(child.session_id, position)
        assert caught.value.code == "lifecycle:invalid_position"
        with pytest.raises(LifecycleError):
            await stack.history.fork(child.session_id, position)
    assert await stack.history(child.session_id) == before
    assert await stack.history.revert(child.session_id, cut) == [] and await stack.history(child.session_id) == before


async def test_fork_is_a_new_session_of_the_tree_without_the_sources_pending_mail(stack, calls):
    root, child = await tree_of(stack, child_status="idle")
    waiting = await send(stack, calls, root, child.handle, "for the source only")
    at = await stack.history.position(child.session_id)

    fork = await stack.history.fork(child.session_id, at)

    assert fork.session_id != child.session_id and fork.handle not in (None, child.handle)
    assert fork.handle.startswith("explore_") and fork.root_session_id == root.session_id
    assert await stack.obligations.pending_mail(fork.session_id) == []
    assert [m.message_id for m in await stack.obligations.pending_mail(child.session_id)] == [waiting]
    history = [e for _, e in await stack.history(fork.session_id)]
    assert isinstance(history[0], ev.SessionRegistered) and history[0].parent_session_id == root.session_id
    assert history[1] == ev.SessionForked(at=history[1].at, source_session_id=child.session_id, at_position=at)
    # Its own handle and id both address it, within the tree, with the source's rules.
    by_handle = await send(stack, calls, root, fork.handle, "hello fork")
    assert [m.message_id for m in await stack.obligations.pending_mail(fork.session_id)] == [by_handle]
    await live(stack, fork)  # the fork answers from its own open run
    await send(stack, calls, fork, root.session_id, "the fork replies")
    assert await stack.tool_definition(fork.session_id) == await stack.tool_definition(child.session_id)
    # Its directory record is the source's origin under its own id and handle.
    fork_record = await adapters(stack).sessions.record(fork.session_id)
    source_record = await adapters(stack).sessions.record(child.session_id)
    assert replace(fork_record, session_id=child.session_id, handle=child.handle) == source_record


async def test_a_ghost_session_created_on_a_reverted_branch_stays_addressable_by_its_id(stack, calls):
    root, _ = await tree_of(stack)
    cut = await stack.history.position(root.session_id)
    await stack.start_run(root.session_id, "run-1")
    ghost = await stack.register_child(root.session_id, "review", "delegated on the branch", rules={"*": "allow"},
                                       status="running")
    await live(stack, ghost)
    await send(stack, calls, ghost, root.session_id, "done reviewing")

    await stack.history.revert(root.session_id, cut)
    await stack.start_run(root.session_id, "run-2")  # the revert ended the root's run; it sends from a new one

    assert await send(stack, calls, root, ghost.session_id, "are you still there?", run_id="run-2")
    assert await send(stack, calls, ghost, root.session_id, "yes")
    assert await send(stack, calls, root, ghost.handle, "and by handle", run_id="run-2")


async def test_live_snapshots_mail_and_views_equal_a_full_replay_after_reverts_and_forks(redis_url):
    calls = Calls()
    async with running_stack(redis_url, max_pending_per_session=1000, max_inflight_per_pair=0) as host:
        runner = ProjectionRunner(EventStore(adapters(host).redis, adapters(host).config.service), adapters(host).config)
        await runner.start()
        root, child = await tree_of(host)
        sibling = await host.register_child(root.session_id, "review", "x", rules={"*": "allow"}, status="idle")
        await live(host, sibling)
        sessions = [root.session_id, child.session_id, sibling.session_id]
        await host.start_run(child.session_id, "run-1")
        for i in range(4):
            await send(host, calls, root, child.handle, f"r{i}")
            await send(host, calls, sibling, child.handle, f"s{i}", mode="queue")
        cut = await host.history.position(child.session_id)
        for n, delivery in enumerate(await host.claim(child.session_id, "run-1")):
            if n % 2 == 0:
                await host.consume(child.session_id, delivery.message_id)
        await host.inject(child.session_id, "plugin", "build finished", mode="steer")
        fork = await host.history.fork(child.session_id, cut)
        sessions.append(fork.session_id)
        await send(host, calls, child, fork.handle, "hello fork")
        await host.history.revert(child.session_id, cut)
        await host.start_run(child.session_id, "run-2")
        for delivery in await host.claim(child.session_id, "run-2"):
            await host.consume(child.session_id, delivery.message_id)
        second_cut = await host.history.position(child.session_id)
        await send(host, calls, root, child.handle, "after the second cut")
        await host.finish_run(child.session_id, "run-2")
        await host.history.revert(child.session_id, cut)  # further back than the first revert's branch
        await host.history.revert(fork.session_id, 1)

        while await runner.step(block_ms=50):
            pass
        await assert_live_equals_replay(host, sessions)
        views = await live_views(host)
        rebuilt = await rebuild(adapters(host).store, list(range(adapters(host).config.service.partitions)), write=False)
        assert views == {key: dict(view) for key, view in rebuilt.items()}
        child_record = await adapters(host).sessions.record(child.session_id)
        inbox = views[("inbox", child_record.partition)]
        assert int(inbox[child.session_id]) == (await adapters(host).store.load(child_record)).state.pending_agent > 0
        assert second_cut > cut
