"""The session lifecycle where it meets the rest of treemail, through the real stack: peer routes and
interrupts from the exact live sender, a disposal settling its senders' send records, a settlement notice
as mail."""

import pytest

from treemail.domain import events as ev
from treemail.host import SendContext

from .conftest import adapters, live, running_stack

pytestmark = pytest.mark.cluster


def code(result):
    return result.get("error", {}).get("code")


def of_type(history, cls):
    return [e for _, e in history if isinstance(e, cls)]


async def test_a_peer_send_needs_the_senders_open_run_and_a_target_before_its_cutoff(stack, calls):
    planner = await stack.register_root("planner", "plans", rules={})
    advisor = await stack.register_root("advisor", "advises", rules={}, status="idle")
    await stack.peers.register_route("advisor", advisor.session_id, source_session_id=planner.session_id)
    await stack.peers.set_grant(advisor.session_id, source_session_id=planner.session_id, send=True)

    stale = await stack.peers.send(calls.ctx(planner.session_id), {"peer": "advisor", "body": "too early"})
    assert code(stale) == "send_message:sender_not_live"
    await live(stack, planner)
    first_call = calls.ctx(planner.session_id)
    first = await stack.peers.send(first_call, {"peer": "advisor", "body": "before the cutoff"})
    assert "message_id" in first

    disposed = await stack.disposal.dispose(advisor.session_id)
    assert list(disposed.returned) == [first["message_id"]]
    late = await stack.peers.send(calls.ctx(planner.session_id), {"peer": "advisor", "body": "after it"})
    assert code(late) == "send_message:recipient_closing"
    # Retried after the cutoff, the call accepted before it keeps its outcome.
    assert await stack.peers.send(first_call, {"peer": "advisor", "body": "before the cutoff"}) == first
    # The peer's message came back to the planner as treemail's notice.
    [notice] = [d for d in await stack.claim(planner.session_id, "run-1") if d.owner == "returned"]
    assert notice.text.startswith('<treemail_notice kind="message_returned">') and "before the cutoff" in notice.text


async def test_a_fork_below_a_draining_session_drains_too(stack, calls):
    root = await stack.register_root("planner", "plans", rules={"*": "allow"}, status="running")
    child = await stack.register_child(root.session_id, "explore", "reads", rules={"*": "allow"}, status="running")
    await stack.disposal.drain(root.session_id)
    fork = await stack.history.fork(child.session_id, await stack.history.position(child.session_id))
    await live(stack, fork)
    refused = await stack.send_message(calls.ctx(fork.session_id), {"to": root.handle, "body": "x"})
    assert code(refused) == "send_message:draining"
    await stack.disposal.undrain(root.session_id)
    assert "message_id" in await stack.send_message(calls.ctx(fork.session_id), {"to": root.handle, "body": "y"})


async def test_only_the_callers_open_run_interrupts_and_a_retry_after_it_ended_gets_the_first_outcome(stack, calls):
    rules = {"message": {"child": "allow"}, "interrupt": {"child": "allow"}}
    root = await stack.register_root("planner", "plans", rules=rules)
    child = await stack.register_child(root.session_id, "explore", "reads", rules={"parent": "allow"})
    await stack.start_run(child.session_id, "run-c")
    refused = await stack.interrupts.interrupt_agent(calls.ctx(root.session_id), {"to": child.handle})
    assert code(refused) == "interrupt_agent:sender_not_live"

    await live(stack, root)
    ctx = calls.ctx(root.session_id)
    first = await stack.interrupts.interrupt_agent(ctx, {"to": child.handle, "reason": "stop"})
    assert first["result"] == "interrupt_requested"
    await stack.finish_run(root.session_id, "run-1")
    assert await stack.interrupts.interrupt_agent(ctx, {"to": child.handle, "reason": "stop"}) == first
    assert code(await stack.interrupts.interrupt_agent(calls.ctx(root.session_id), {"to": child.handle})) == (
        "interrupt_agent:sender_not_live")
    assert len(of_type(await stack.history(child.session_id), ev.SessionInterruptRequested)) == 1


async def test_mail_returned_by_a_disposal_is_processed_for_its_sender_and_frees_its_capacity(redis_url, calls):
    async with running_stack(redis_url, max_outstanding_per_source=1) as host:
        root = await host.register_root("planner", "plans", rules={"child": "allow"}, status="running")
        a = await host.register_child(root.session_id, "explore", "a", status="running")
        b = await host.register_child(root.session_id, "review", "b", status="running")
        await live(host, root)
        sent = await host.send_message(calls.ctx(root.session_id), {"to": a.handle, "body": "never read"})
        assert code(await host.send_message(calls.ctx(root.session_id), {"to": b.handle, "body": "x"})) == (
            "send_message:source_capacity")

        await host.disposal.dispose(a.session_id, "aborted")

        status = await host.obligations.inspect(sent["message_id"], root.session_id)
        assert status["status"] == "processed" and status["settlement"]["outcome"] == "discarded"
        assert status["reason"].startswith("recipient disposed before processing it; returned to its sender")
        [settled] = of_type(await host.history(root.session_id), ev.MessageSettled)
        assert settled.message_id == sent["message_id"]
        assert "message_id" in await host.send_message(calls.ctx(root.session_id), {"to": b.handle, "body": "y"})
        # The returned notice on the root's own stream was never counted as mail it sent.
        assert (await adapters(host).store.load(await adapters(host).sessions.record(root.session_id))).state.outstanding == 1


async def test_a_settlement_notice_is_mail_with_attempts_and_never_a_message_the_child_sent(stack, calls):
    root = await stack.register_root("planner", "plans", rules={"child": "allow"}, status="running")
    child = await stack.register_child(root.session_id, "explore", "reads", rules={"parent": "allow"},
                                       status="running")
    await live(stack, root, child)
    await stack.send_message(SendContext(root.session_id, "run-1", "go"), {"to": child.handle, "body": "go"})
    assert await stack.finish_run(child.session_id, "run-1", "refusal", "I will not do that.") == "steered"

    [notice] = [d for d in await stack.claim(root.session_id, "run-1") if d.owner == "settlement"]
    assert "declined the task." in notice.text and "I will not do that." in notice.text
    # the child it reports on, under treemail's own kind: never its words
    assert notice.sender_session_id == child.session_id and notice.source_kind == "subagent_settled"
    status_before = [m for m in await stack.obligations.pending_mail(root.session_id) if m.message_id == notice.message_id]
    assert status_before[0].attempts == 1  # claimed like any mail (a delivery attempt)
    await stack.release(root.session_id, notice.message_id)
    await stack.finish_run(root.session_id, "run-1")
    child_state = (await adapters(stack).store.load(await adapters(stack).sessions.record(child.session_id))).state
    assert child_state.outstanding == 0  # the notice is the parent's mail, never an intent of the child's
    [finished] = [e for e in of_type(await stack.history(child.session_id), ev.SessionRunFinished)]
    assert finished.reason == "refusal"
