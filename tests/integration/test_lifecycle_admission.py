"""Session lifecycle through the real stack: the exact live sender, drains, the disposal cutoff, parents,
not-resumable sessions, settlement notices and return guidance (host API -> workers -> Lua, real Valkey)."""

import pytest

from treemail.adapters import keys
from treemail.domain import commands as c
from treemail.domain.errors import LifecycleError
from treemail.host import SendContext
from .conftest import adapters

pytestmark = pytest.mark.cluster

PEERS = {"parent": "allow", "sibling": "allow", "child": "allow"}


def code(result):
    return result.get("error", {}).get("code")


def of_type(history, name):
    return [e for _, e in history if type(e).__name__ == name]


async def family(host, *, parent_status="running", continuable=True):
    """root (running run-root unless told otherwise) with children a and b, each with its open run-1.
    ``continuable=False``: one-shot children, which no send resumes once disposed (``recipient_closing``)."""
    root = await host.register_root("planner", "plans", rules={"*": "allow"}, status=parent_status)
    if parent_status == "running":
        await host.start_run(root.session_id, "run-root")
    a = await host.register_child(root.session_id, "explore", "reads", rules=PEERS, status="running",
                                  continuable=continuable)
    b = await host.register_child(root.session_id, "review", "reviews", rules=PEERS, status="running",
                                  continuable=continuable)
    for child in (a, b):
        await host.start_run(child.session_id, "run-1")
    return root, a, b


async def send(host, session, run_id, call, to, body="hi", mode="steer"):
    return await host.send_message(SendContext(session.session_id, run_id, call), {"to": to, "body": body, "mode": mode})


# ---- exact live sender -----------------------------------------------------------------------------------


async def test_only_the_open_run_sends_and_a_retried_call_from_an_ended_run_keeps_its_outcome(stack):
    root, a, _ = await family(stack)
    first = await send(stack, a, "run-1", "call-1", root.handle, "found it")
    assert "message_id" in first
    assert code(await send(stack, a, "run-invented", "call-2", root.handle)) == "send_message:sender_not_live"
    await stack.finish_run(a.session_id, "run-1")
    # The same tool call retried after its run ended: the original outcome, nothing appended.
    assert await send(stack, a, "run-1", "call-1", root.handle, "found it") == first
    assert code(await send(stack, a, "run-1", "call-3", root.handle)) == "send_message:sender_not_live"
    await stack.start_run(a.session_id, "run-2")  # resumed: a new incarnation
    assert code(await send(stack, a, "run-1", "call-4", root.handle)) == "send_message:sender_not_live"
    assert "message_id" in await send(stack, a, "run-2", "call-5", root.handle)
    accepted = of_type(await stack.history(root.session_id), "ProducerMessageAccepted")
    assert [e.tool_call_id for e in accepted] == ["call-1", "call-5"]


# ---- draining --------------------------------------------------------------------------------------------------


async def test_a_draining_service_refuses_new_sends_and_still_delivers_accepted_mail(stack):
    root, a, _ = await family(stack)
    before = await send(stack, root, "run-root", "call-1", a.handle, "accepted before the drain")
    await stack.disposal.drain()
    refused = await send(stack, root, "run-root", "call-2", a.handle)
    assert code(refused) == "send_message:draining"
    [delivery] = await stack.claim(a.session_id, "run-1")
    assert delivery.message_id == before["message_id"]
    await stack.disposal.undrain()
    assert "message_id" in await send(stack, root, "run-root", "call-3", a.handle)


async def test_draining_a_subtree_refuses_sends_from_and_to_it_and_its_later_children(stack):
    root, a, b = await family(stack)
    grandchild = await stack.register_child(a.session_id, "grep", "greps", rules=PEERS, status="running")
    await stack.start_run(grandchild.session_id, "run-1")
    assert await stack.disposal.drain(a.session_id) == 2
    assert code(await send(stack, a, "run-1", "c1", root.handle)) == "send_message:draining"
    assert code(await send(stack, grandchild, "run-1", "c2", a.handle)) == "send_message:draining"
    assert code(await send(stack, root, "run-root", "c3", grandchild.handle)) == "send_message:draining"
    assert "message_id" in await send(stack, root, "run-root", "c4", b.handle)  # outside the subtree
    late = await stack.register_child(a.session_id, "late", "registered after the drain", rules=PEERS,
                                      status="running")
    await stack.start_run(late.session_id, "run-1")
    assert code(await send(stack, late, "run-1", "c5", a.handle)) == "send_message:draining"
    await stack.disposal.undrain(a.session_id)
    assert "message_id" in await send(stack, late, "run-1", "c6", a.handle)


async def test_the_drain_is_checked_again_before_a_send_is_decided_again(stack):
    """A send whose append lost to another writer is decided again on fresh state, drain included."""
    from treemail.consumers.app import Worker
    from treemail.services.sends import SendService

    from .conftest import make_config

    root, a, _ = await family(stack)
    config = make_config(adapters(stack).config.service.redis_url)
    worker = Worker(config, adapters(stack).config.service.redis_url, consumer="interfering")
    await worker.start()
    try:
        service: SendService = worker.decider
        original = service._load
        rounds = []

        async def load_then_interfere(work):
            loaded = await original(work)
            rounds.append(loaded.service_draining)  # read every round
            if len(rounds) == 1:
                # After this round loaded its state: another writer appends to the recipient, and a drain begins.
                await stack.inject(a.session_id, "plugin", "interference")
                await stack.disposal.drain()
            return loaded

        service._load = load_then_interfere
        command = c.SendMessage("cmd-x", SendContext(root.session_id, "run-root", "call-x"),
                                c.SendArguments(to=a.handle, body="raced"), "nobody")
        outcomes = (await service.decide([command])).outcomes
    finally:
        await worker.stop()
        await stack.disposal.undrain()
    assert rounds == [False, True]
    assert outcomes["cmd-x"]["error"]["code"] == "send_message:draining"


# ---- disposal ---------------------------------------------------------------------------------------------------


async def test_dispose_returns_unprocessed_mail_to_its_senders_and_refuses_sends_after_the_cutoff(stack):
    root, a, b = await family(stack, continuable=False)
    consumed = await send(stack, root, "run-root", "c1", a.handle, "read this")
    [d] = await stack.claim(a.session_id, "run-1")
    await stack.consume(a.session_id, d.message_id)
    claimed = await send(stack, root, "run-root", "c2", a.handle, "claimed, never acknowledged")
    await stack.claim(a.session_id, "run-1")
    pending = await send(stack, b, "run-1", "c3", a.handle, "never claimed", mode="queue")

    disposed = await stack.disposal.dispose(a.session_id, "aborted", "I got halfway")

    assert set(disposed.returned) == {claimed["message_id"], pending["message_id"]}
    assert code(await send(stack, root, "run-root", "c4", a.handle)) == "send_message:recipient_closing"
    with pytest.raises(LifecycleError):
        await stack.consume(a.session_id, claimed["message_id"])  # past the cutoff nothing is acknowledged
    history = await stack.history(a.session_id)
    discarded = {e.message_id: e.reason for e in of_type(history, "ProducerMessageDiscarded")}
    assert set(discarded) == set(disposed.returned) and consumed["message_id"] not in discarded
    # Each sender got its message back as a notice, treemail's words, never an agent's.
    root_notes = [d for d in await stack.claim(root.session_id, "run-root") if d.owner == "returned"]
    assert len(root_notes) == 1 and "claimed, never acknowledged" in root_notes[0].text
    assert root_notes[0].text.startswith('<treemail_notice kind="message_returned">')
    assert root_notes[0].message_id in discarded[claimed["message_id"]]
    [b_note] = [d for d in await stack.claim(b.session_id, "run-1") if d.owner == "returned"]
    assert "never claimed" in b_note.text and f"{a.handle} was disposed (aborted)" in b_note.text
    # A second dispose completes nothing new and writes no second notice.
    again = await stack.disposal.dispose(a.session_id, "aborted")
    assert again.returned == {}
    assert len(of_type(await stack.history(b.session_id), "ProducerMessageAccepted")) == 1


async def test_a_tool_call_accepted_before_the_cutoff_and_retried_after_it_keeps_its_outcome(stack):
    root, a, _ = await family(stack, continuable=False)
    first = await send(stack, root, "run-root", "c1", a.handle, "before")
    await stack.disposal.dispose(a.session_id)
    assert await send(stack, root, "run-root", "c1", a.handle, "before") == first
    assert code(await send(stack, root, "run-root", "c2", a.handle)) == "send_message:recipient_closing"


async def test_a_sender_being_disposed_is_refused_and_an_interrupted_disposal_completes(stack):
    root, a, b = await family(stack, continuable=False)
    await send(stack, b, "run-1", "c0", a.handle, "pending when a closes")
    # Only the first step, as if the host died right after the cutoff.
    await adapters(stack).sessions.execute(c.DisposeSession(a.session_id, "aborted"))
    assert code(await send(stack, a, "run-1", "c1", root.handle)) == "send_message:sender_closing"
    assert code(await send(stack, b, "run-1", "c2", a.handle)) == "send_message:recipient_closing"
    disposed = await stack.disposal.dispose(a.session_id)
    assert len(disposed.returned) == 1
    assert of_type(await stack.history(a.session_id), "SessionClosed")


async def test_reconcile_completes_a_disposal_the_host_did_not_live_to_finish(stack):
    root, a, b = await family(stack)
    await send(stack, root, "run-root", "c0", a.handle, "go")
    await send(stack, b, "run-1", "c1", a.handle, "unread when the host died")
    await adapters(stack).sessions.execute(c.DisposeSession(a.session_id, "error", "host crashed"))
    await stack.obligations.reconcile(interrupted_runs=True)
    history = await stack.history(a.session_id)
    assert of_type(history, "SessionClosed")
    [settled] = of_type(history, "SessionSettled")
    assert (settled.stop_reason, settled.closing_text, settled.disposed) == ("error", "host crashed", True)
    returned = [e for e in of_type(await stack.history(b.session_id), "ProducerMessageAccepted")
                if e.owner == "returned"]
    assert len(returned) == 1 and returned[0].body.endswith("unread when the host died")


async def test_a_child_writing_to_a_disposed_parent_gets_parent_unavailable(stack):
    root, a, _ = await family(stack)
    await stack.disposal.dispose(root.session_id)
    assert code(await send(stack, a, "run-1", "c1", root.handle)) == "send_message:parent_unavailable"
    assert code(await send(stack, a, "run-1", "c2", root.session_id)) == "send_message:parent_unavailable"


async def test_a_session_that_is_not_continuable_is_never_woken(stack):
    root, _, _ = await family(stack)
    once = await stack.register_child(root.session_id, "once", "runs once", rules=PEERS, status="running",
                                      continuable=False)
    await stack.start_run(once.session_id, "run-1")
    await stack.finish_run(once.session_id, "run-1")
    queued = await send(stack, root, "run-root", "c1", once.handle, "for its host's next run")
    assert "message_id" in queued
    assert not of_type(await stack.history(once.session_id), "SessionWakeRequested")
    await stack.set_status(once.session_id, "finished")
    assert code(await send(stack, root, "run-root", "c2", once.handle)) == "send_message:not_resumable"


# ---- settlement notices ---------------------------------------------------------------------------------------


async def test_settlement_gates_in_their_order(stack):
    root, a, b = await family(stack)
    # Not announced: nobody ever sent b a message.
    assert await stack.finish_run(b.session_id, "run-1", "completed", "done") == "not_announced"
    # Busy parent: steered into its running turn, rendered as a notice.
    await send(stack, root, "run-root", "c1", a.handle, "go")
    assert await stack.finish_run(a.session_id, "run-1", "completed", "3 bugs found") == "steered"
    [notice] = [d for d in await stack.claim(root.session_id, "run-root") if d.owner == "settlement"]
    assert notice.text == (
        '<treemail_notice kind="subagent_settled">\n'
        f"Background subagent {a.handle} (session {a.session_id}) finished and will do no further work unless you "
        "send it more.\n\n"
        "3 bugs found\n</treemail_notice>"
    )
    assert notice.sender_session_id == a.session_id and notice.source_kind == "subagent_settled"
    # Idle parent: queued as a new turn, and woken for it.
    await stack.consume(root.session_id, notice.message_id)
    await stack.finish_run(root.session_id, "run-root")
    await stack.start_run(a.session_id, "run-2")
    assert await stack.finish_run(a.session_id, "run-2", "max_tokens") == "queued"
    [wake] = [w for w in await stack.wakes("runner", block_ms=2000) if w.session_id == root.session_id]
    assert await stack.wake_run(wake, "run-root-2")
    [queued] = await stack.claim(root.session_id, "run-root-2")
    assert "ran out of room before it finished." in queued.text and "It left no closing message." in queued.text
    settled = of_type(await stack.history(a.session_id), "SessionSettled")
    assert [(s.notice, s.stop_reason) for s in settled] == [("steered", "completed"), ("queued", "max_tokens")]


async def test_the_notice_carries_the_closing_text_blocks_byte_exact_and_comes_even_after_the_child_reported(stack):
    """Then the child's closing message as text blocks in order (reasoning and tool calls left out), or
    "It left no closing message."; a runtime notice sent even when the child already reported by mail."""
    root, a, b = await family(stack)
    await send(stack, root, "run-root", "c1", a.handle, "go")
    await send(stack, root, "run-root", "c2", b.handle, "go too")
    # the child already reported its result by mail
    assert "message_id" in await send(stack, a, "run-1", "r1", root.handle, "result: 3 bugs")
    closing = [{"type": "thinking", "thinking": "let me sum up"}, {"type": "text", "text": "Fixed:\n  cache.py "},
               {"type": "tool_use", "id": "t1", "name": "done", "input": {}}, {"type": "text", "text": "Bye. ✓"}]
    assert await stack.finish_run(a.session_id, "run-1", "completed", closing) == "steered"
    # an empty closing output is no closing message, never an error
    assert await stack.finish_run(b.session_id, "run-1", "error", "") == "steered"
    claimed = await stack.claim(root.session_id, "run-root")
    assert [d.source_kind for d in claimed] == ["agent_message", "subagent_settled", "subagent_settled"]
    report, settled_a, settled_b = claimed
    assert report.sender_session_id == a.session_id and "result: 3 bugs" in report.text
    body = {e.message_id: e.body for e in of_type(await stack.history(root.session_id), "ProducerMessageAccepted")}
    assert body[settled_a.message_id] == (
        f"Background subagent {a.handle} (session {a.session_id}) finished and will do no further work unless you "
        "send it more.\n\nFixed:\n  cache.py \n\nBye. ✓")
    assert body[settled_b.message_id] == (
        f"Background subagent {b.handle} (session {b.session_id}) failed before it finished.\n\n"
        "It left no closing message.")


async def test_a_parent_being_disposed_has_the_notice_injected_and_a_gone_parent_gets_nothing(stack):
    root, a, b = await family(stack)
    await send(stack, root, "run-root", "c1", a.handle, "go")
    await send(stack, root, "run-root", "c2", b.handle, "go")
    await adapters(stack).sessions.execute(c.DisposeSession(root.session_id))
    assert await stack.finish_run(a.session_id, "run-1", "error", "crashed") == "injected"
    await stack.disposal.dispose(root.session_id)
    assert await stack.finish_run(b.session_id, "run-1", "completed") == "parent_unavailable"
    settled = of_type(await stack.history(b.session_id), "SessionSettled")
    assert [(s.notice, s.message_id) for s in settled] == [("parent_unavailable", None)]


async def test_a_notice_that_cannot_be_delivered_is_counted_and_never_fails_the_childs_finish(stack):
    from treemail.adapters import metrics

    root, a, _ = await family(stack)
    await send(stack, root, "run-root", "c1", a.handle, "go")
    record = await adapters(stack).sessions.record(root.session_id)
    await adapters(stack).redis.hset(keys.session_snapshot(record.partition, record.session_id), "snapshot", "{not json")
    def failures():
        return metrics.HOST_REGISTRY.get_sample_value("treemail_settlement_notice_failures_total") or 0

    before = failures()
    assert await stack.finish_run(a.session_id, "run-1", "completed", "done") == "failed"
    assert failures() == before + 1
    assert of_type(await stack.history(a.session_id), "SessionRunFinished")


async def test_a_disposal_settles_with_the_parent_once(stack):
    root, a, _ = await family(stack)
    await send(stack, root, "run-root", "c1", a.handle, "go")
    assert (await stack.disposal.dispose(a.session_id, "aborted", "stopped early")).settlement == "steered"
    assert (await stack.disposal.dispose(a.session_id, "aborted", "stopped early")).settlement == "steered"
    notices = [d for d in await stack.claim(root.session_id, "run-root") if d.owner == "settlement"]
    assert len(notices) == 1 and "was disposed: it will do no further work" in notices[0].text


# ---- return guidance ------------------------------------------------------------------------------------------


async def test_return_guidance_only_for_a_child_that_can_message_its_parent(stack):
    root, a, _ = await family(stack)
    mute = await stack.register_child(root.session_id, "mute", "no tool")
    assert (await stack.permissions.return_guidance(a.session_id)).startswith(
        f'Your parent agent is {root.handle}. Before you finish, send your result to that agent with '
        f'send_message(to="{root.handle}", body="<self-contained result>").'
    )
    assert await stack.permissions.return_guidance(mute.session_id) is None
    assert await stack.permissions.return_guidance(root.session_id) is None
