"""Whole subtrees through the real stack: a broadcast to a 3-level tree with full inboxes (two workers), its
resumption, and cascading stops bottom-up with their settlement notices in order."""

import asyncio

import pytest

from treemail.adapters import keys
from treemail.domain import events as ev
from treemail.domain.commands import DisposeSession
from treemail.domain.errors import LifecycleError, Rejected
from treemail.domain.decide.subtree import copy_call
from treemail.host import SendContext
from treemail.services.disposal import DisposalService
from treemail.services.settlement import SettlementService
from treemail.services.subtree import SubtreeService

from .conftest import adapters, live, running_stack

pytestmark = pytest.mark.cluster

# Every relationship may be written to: grandchildren are "*" to their grandparent.
RULES = {"message": {"*": "allow"}, "interrupt": {"child": "allow"}}


async def three_levels(host):
    """root -> a (-> a1, a2), b (-> b1)."""
    root = await host.register_root("lead", "leads", rules=RULES)
    a = await host.register_child(root.session_id, "planner", "plans", rules=RULES)
    b = await host.register_child(root.session_id, "planner", "plans", rules=RULES)
    a1 = await host.register_child(a.session_id, "worker", "works", rules=RULES)
    a2 = await host.register_child(a.session_id, "worker", "works", rules=RULES)
    b1 = await host.register_child(b.session_id, "worker", "works", rules=RULES)
    return root, a, b, a1, a2, b1


def by_id(*sessions):
    """Siblings in the order a subtree lists them: by session id (time-ordered)."""
    return sorted(sessions, key=lambda s: s.session_id)


def ids_of(sessions):
    return [s.session_id for s in sessions]


async def of_type(host, session_id, cls, **match):
    return [e for _, e in await host.history(session_id)
            if isinstance(e, cls) and all(getattr(e, k) == v for k, v in match.items())]


async def test_a_broadcast_reaches_every_descendant_once_with_refusals_per_recipient_and_resumes_without_duplicates(
    redis_url,
):
    async with running_stack(redis_url, workers=2, max_pending_per_session=1) as tm:
        root, a, b, a1, a2, b1 = await three_levels(tm)
        await live(tm, root)
        # a1 and b already hold as much agent mail as they may: their copies are refused.
        for full in (a1, b):
            assert "message_id" in await tm.send(root.session_id, full.handle, "earlier work")

        result = await tm.peers.broadcast_subtree(root.session_id, "stop and report", idempotency_key="k1")
        assert result["result"] == "broadcast" and result["recipients"] == 5
        assert {r["session_id"]: r["code"] for r in result["refused"]} == {
            a1.session_id: "send_message:inbox_full", b.session_id: "send_message:inbox_full"}
        delivered = {d["session_id"]: d["message_id"] for d in result["delivered"]}
        assert set(delivered) == {a.session_id, a2.session_id, b1.session_id}
        assert result["message"].startswith("sent to 3 of 5 agents below you; refused: ")

        async def copies(session):
            return await of_type(tm, session.session_id, ev.ProducerMessageAccepted, body="stop and report")

        for session in (a, a2, b1):
            [copy] = await copies(session)
            assert copy.message_id == delivered[session.session_id] and copy.sender_session_id == root.session_id
        for session in (a1, b):
            assert await copies(session) == []

        # Resumed (a crash after some copies, or a retry): the same broadcast, the same recipients, no copy twice,
        # and a session attached since gets nothing: the set was fixed when the broadcast was decided.
        a3 = await tm.register_child(a.session_id, "worker", "works", rules=RULES)
        again = await tm.peers.broadcast_subtree(root.session_id, "stop and report", idempotency_key="k1")
        assert again["broadcast_id"] == result["broadcast_id"] and again["recipients"] == 5
        assert {d["session_id"]: d["message_id"] for d in again["delivered"]} == delivered
        for session in (a, a2, b1):
            assert len(await copies(session)) == 1
        assert await copies(a3) == []
        conflict = await tm.peers.broadcast_subtree(root.session_id, "something else", idempotency_key="k1")
        assert conflict["error"]["code"] == "message_subtree:idempotency_conflict"

        [started] = await of_type(tm, root.session_id, ev.SubtreeBroadcastStarted)
        assert started.broadcast_id == result["broadcast_id"]
        # Top-down: the children, then each child's children.
        level2 = by_id(a, b)
        level3 = [c for p in level2 for c in (by_id(a1, a2) if p is a else [b1])]
        assert started.recipients == ids_of(level2 + level3)
        [record] = await of_type(tm, root.session_id, ev.SubtreeBroadcastDelivered)
        assert record.accepted == delivered and record.refused == {
            a1.session_id: "send_message:inbox_full", b.session_id: "send_message:inbox_full"}

        # Each copy is an ordinary message: claimable by its recipient's run like any other.
        await tm.start_run(a.session_id, "run-a")
        claimed = await tm.claim(a.session_id, "run-a")
        assert [d.message_id for d in claimed] == [delivered[a.session_id]]

        # A crash after the broadcast was recorded and two copies were sent: the same call again sends the
        # rest, and the two are neither sent again nor given new ids.
        server = adapters(tm)
        service = SubtreeService(server.store, server.sessions,
                                 DisposalService(server.store, server.sessions, SettlementService(server.sessions)))
        sender = await server.sessions.record(root.session_id)
        cut = await service.start_broadcast(sender, "run-1", "key:k2", "second wave", "queue")
        early = {}
        for recipient in cut.recipients[:2]:
            sent = await tm.send_message(SendContext(root.session_id, "run-1", copy_call(cut.broadcast_id, recipient)),
                                         {"to": recipient, "body": "second wave", "mode": "queue"})
            early[recipient] = sent.get("message_id")
        # Attached while the copies were being delivered: not one of the recipients.
        late = await tm.register_child(b.session_id, "worker", "works", rules=RULES)
        resumed = await tm.peers.broadcast_subtree(root.session_id, "second wave", mode="queue", idempotency_key="k2")
        assert resumed["broadcast_id"] == cut.broadcast_id and late.session_id not in cut.recipients
        assert a3.session_id in cut.recipients  # attached before this broadcast: one of them
        outcomes = {d["session_id"]: d["message_id"] for d in resumed["delivered"]}
        outcomes.update({r["session_id"]: None for r in resumed["refused"]})
        assert set(outcomes) == set(cut.recipients) and all(outcomes[r] == early[r] for r in early)
        for recipient in cut.recipients:
            waves = [e for _, e in await tm.history(recipient)
                     if isinstance(e, ev.ProducerMessageAccepted) and e.body == "second wave"]
            assert len(waves) == (0 if outcomes[recipient] is None else 1)

        # Not from a session with no open run: nothing is recorded, nothing sent.
        refused = await tm.peers.broadcast_subtree(b.session_id, "hello")
        assert refused["error"]["code"] == "message_subtree:sender_not_live"
        assert await of_type(tm, b.session_id, ev.SubtreeBroadcastStarted) == []


async def test_the_installed_tool_broadcasts_from_the_models_run(stack, calls):
    root, a, b, a1, a2, b1 = await three_levels(stack)
    await live(stack, root)
    assert "message_subtree" not in [t["name"] for t in await stack.tools.definitions(root.session_id)]
    await stack.tools.install(root.session_id, ["message_subtree"])
    context = calls.ctx(root.session_id)
    result = await stack.tools.call(context, "message_subtree", {"body": "new plan", "mode": "queue"})
    assert result["recipients"] == 5 and len(result["delivered"]) == 5 and result["refused"] == []
    retried = await stack.tools.call(context, "message_subtree", {"body": "new plan", "mode": "queue"})
    assert retried["broadcast_id"] == result["broadcast_id"]
    assert len(await of_type(stack, b1.session_id, ev.ProducerMessageAccepted, body="new plan")) == 1

    # Every copy is under the sender's rules: a lead that may write only to its children reaches no grandchild.
    lead = await stack.register_root("lead", "leads", rules={"child": "allow"})
    child = await stack.register_child(lead.session_id, "planner", "plans", rules=RULES)
    grandchild = await stack.register_child(child.session_id, "worker", "works", rules=RULES)
    await live(stack, lead)
    result = await stack.peers.broadcast_subtree(lead.session_id, "only for children")
    assert [d["session_id"] for d in result["delivered"]] == [child.session_id]
    assert [(r["session_id"], r["code"]) for r in result["refused"]] == [(grandchild.session_id, "permission_denied")]
    assert await of_type(stack, grandchild.session_id, ev.ProducerMessageAccepted) == []


async def test_a_cascading_disposal_goes_bottom_up_with_each_parents_notices_leaves_first(stack):
    root, a, b, a1, a2, b1 = await three_levels(stack)
    a11 = await stack.register_child(a1.session_id, "worker", "works", rules=RULES)
    await live(stack, root)
    # Mail makes each session owe its parent a settlement notice when it ends.
    await stack.peers.broadcast_subtree(root.session_id, "wrap up")

    rows = await stack.disposal.stop_subtree(a.session_id, "dispose", reason="aborted")
    first, second = by_id(a1, a2)
    assert [r["session_id"] for r in rows] == ids_of([a11, first, second, a])
    assert all(r["settlement"] is not None for r in rows)
    [started] = await of_type(stack, a.session_id, ev.SubtreeStopStarted)
    assert started.how == "dispose" and started.order == [r["session_id"] for r in rows]

    async def notices(session):
        return [e.body for e in await of_type(stack, session.session_id, ev.ProducerMessageAccepted, owner="settlement")]

    # Each parent got its children's notices while it was still open, in the order they were stopped.
    [from_a11] = await notices(a1)
    assert a11.handle in from_a11
    from_first, from_second = await notices(a)
    assert first.handle in from_first and second.handle in from_second
    [from_a] = await notices(root)
    assert a.handle in from_a
    for session in (a11, a1, a2, a):
        assert await of_type(stack, session.session_id, ev.SessionClosed)
    # Outside the subtree nothing was stopped.
    for session in (root, b, b1):
        assert await of_type(stack, session.session_id, ev.SessionClosing) == []


async def test_a_cascading_interrupt_reaches_the_runners_bottom_up_and_leaves_idle_sessions(stack):
    root, a, b, a1, a2, b1 = await three_levels(stack)
    for session, run in ((a, "run-a"), (a1, "run-a1"), (b1, "run-b1")):
        await stack.start_run(session.session_id, run)

    rows = await stack.disposal.stop_subtree(root.session_id, "interrupt", reason="aborted", idempotency_key="s1")
    level2 = by_id(a, b)
    level3 = [c for p in level2 for c in (by_id(a1, a2) if p is a else [b1])]
    order = level3 + level2 + [root]
    assert [(r["session_id"], r["interrupted"]) for r in rows] == [
        (s.session_id, s in (a, a1, b1)) for s in order]
    triggers = []
    for _ in range(20):
        triggers += await stack.interrupts.read("runner-1", block_ms=100)
        if len(triggers) >= 3:
            break
    assert [t.session_id for t in triggers] == ids_of(s for s in order if s in (a, a1, b1))
    # Resumed with the same key: the order recorded first, no second interrupt.
    await stack.disposal.stop_subtree(root.session_id, "interrupt", reason="aborted", idempotency_key="s1")
    assert len(await of_type(stack, a1.session_id, ev.SessionInterruptRequested)) == 1
    # The same key asking for another stop is refused: a retry never turns the interrupt into a disposal.
    for how, reason in (("dispose", "aborted"), ("interrupt", "error")):
        with pytest.raises(Rejected) as conflict:
            await stack.disposal.stop_subtree(root.session_id, how, reason=reason, idempotency_key="s1")
        assert conflict.value.code.value == "message_subtree:idempotency_conflict"
    assert await of_type(stack, a1.session_id, ev.SessionSealed) == []
    await asyncio.gather(*(stack.interrupts.abort_run(t) for t in triggers))
    [finished] = await of_type(stack, a1.session_id, ev.SessionRunFinished)
    assert finished.reason == "aborted"


# ---- the ends of a subtree: closed for good ----------------------------------------------------------------


async def test_a_cascading_stop_closes_its_subtree_for_good_and_an_ordinary_dispose_stays_resumable(stack):
    root, a, b, a1, a2, b1 = await three_levels(stack)
    await live(stack, root)
    await stack.disposal.stop_subtree(a.session_id, "dispose")
    await stack.disposal.dispose(b1.session_id, "done")
    for stopped in (a, a1):
        refused = await stack.send(root.session_id, stopped.handle, "are you there?")
        assert refused["error"]["code"] == "send_message:recipient_closing", refused
        assert "stopped for good" in refused["error"]["message"]
        assert await of_type(stack, stopped.session_id, ev.SessionResumed) == []
    # An ordinary disposal of a continuable child: the next message starts its next incarnation.
    resumed = await stack.send(root.session_id, b1.handle, "one more thing")
    assert "message_id" in resumed
    assert len(await of_type(stack, b1.session_id, ev.SessionResumed)) == 1


async def test_a_child_registered_under_a_session_a_cascading_stop_reached_is_refused_and_nothing_stored(stack):
    root, a, b, a1, a2, b1 = await three_levels(stack)
    await stack.disposal.stop_subtree(a.session_id, "dispose")
    partition = (await adapters(stack).sessions.record(a.session_id)).partition
    members = await adapters(stack).redis.scard(keys.tree_members(partition, root.session_id))
    for parent in (a, a1):
        with pytest.raises(LifecycleError) as refused:
            await stack.register_child(parent.session_id, "worker", "late", rules=RULES)
        assert refused.value.code == "lifecycle:parent_stopped"
    assert await adapters(stack).redis.scard(keys.tree_members(partition, root.session_id)) == members
    # Outside the stopped subtree registration goes on.
    assert (await stack.register_child(b.session_id, "worker", "works", rules=RULES)).session_id


async def directory_entries(tm) -> int:
    """Every session's directory entry, on every master of a cluster (KEYS asks one node)."""
    return len([key async for key in adapters(tm).redis.scan_iter(match="tm:dir:*", count=1000)])


async def test_no_child_is_left_open_under_a_subtree_a_racing_cascading_stop_closed(redis_url):
    """Registrations race the stop on two workers' worth of concurrency: each is refused, or it joined the
    subtree in time and was closed with it; none stays open under a closed parent."""
    async with running_stack(redis_url, workers=2) as tm:
        for attempt in range(6):
            root, a, b, a1, a2, b1 = await three_levels(tm)

            async def register(parent):
                try:
                    return await tm.register_child(parent.session_id, "worker", "racing", rules=RULES)
                except LifecycleError as error:
                    assert error.code == "lifecycle:parent_stopped"
                    return None

            directory = await directory_entries(tm)
            stop = asyncio.create_task(tm.disposal.stop_subtree(a.session_id, "dispose"))
            racers = await asyncio.gather(*(register(p) for p in (a, a1, a2, a, a1, a2)))
            await stop
            # A refused registration leaves no directory entry behind, however late it was refused.
            joined = [c for c in racers if c is not None]
            assert await directory_entries(tm) == directory + len(joined)
            for child in joined:
                closed = await of_type(tm, child.session_id, ev.SessionClosed)
                sealed = await of_type(tm, child.session_id, ev.SessionSealed)
                assert closed and sealed, (attempt, child)


async def test_mail_held_for_a_next_incarnation_goes_back_to_its_sender_when_a_stop_closes_the_session(stack):
    root, a, b, a1, a2, b1 = await three_levels(stack)
    await live(stack, root)
    # An ordinary disposal of a1 cut short after its cutoff: mail sent now waits for a next incarnation.
    await adapters(stack).sessions.execute(DisposeSession(a1.session_id, "done"))
    held = await stack.send(root.session_id, a1.handle, "for your next run")
    assert "message_id" in held
    await stack.disposal.stop_subtree(a.session_id, "dispose")
    [discarded] = await of_type(stack, a1.session_id, ev.ProducerMessageDiscarded, message_id=held["message_id"])
    assert "returned to its sender" in discarded.reason
    returned = await of_type(stack, root.session_id, ev.ProducerMessageAccepted, owner="returned")
    assert len(returned) == 1 and "for your next run" in returned[0].body
    assert await of_type(stack, a1.session_id, ev.SessionResumed) == []


async def test_a_broadcast_accounts_for_every_descendant_whatever_its_end(stack):
    """Open, closing, disposed and resumable, one-shot disposed, stopped for good: each descendant is in
    ``delivered`` or in ``refused`` with its code, never in neither."""
    root, a, b, a1, a2, b1 = await three_levels(stack)
    one_shot = await stack.register_child(b.session_id, "worker", "once", rules=RULES, continuable=False)
    closing = await stack.register_child(b.session_id, "worker", "closing", rules=RULES)
    await live(stack, root)
    await stack.disposal.stop_subtree(a.session_id, "dispose")           # a, a1, a2: closed for good
    await stack.disposal.dispose(b1.session_id, "done")                  # resumable
    await stack.disposal.dispose(one_shot.session_id, "done")            # one-shot: closed for good
    await adapters(stack).sessions.execute(DisposeSession(closing.session_id, "done"))  # cut short: closing

    result = await stack.peers.broadcast_subtree(root.session_id, "status?")
    delivered = {d["session_id"] for d in result["delivered"]}
    refused = {r["session_id"]: r["code"] for r in result["refused"]}
    everyone = ids_of([a, b, a1, a2, b1, one_shot, closing])
    assert result["recipients"] == len(everyone)
    assert delivered | set(refused) == set(everyone) and not delivered & set(refused)
    assert refused == {s: "send_message:recipient_closing" for s in ids_of([a, a1, a2, one_shot])}
    assert delivered == set(ids_of([b, b1, closing]))
    [recorded] = await of_type(stack, root.session_id, ev.SubtreeBroadcastDelivered)
    assert set(recorded.accepted) == delivered and recorded.refused == refused
