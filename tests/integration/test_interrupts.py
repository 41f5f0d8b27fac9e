"""interrupt_agent through the real stack: the trigger reaches a host runner, the run finishes aborted."""

import asyncio

import pytest

from treemail.domain import events as ev

from .conftest import live

pytestmark = pytest.mark.cluster

RULES = {"message": {"child": "allow", "parent": "allow"}, "interrupt": {"child": "allow"}}


async def family(host):
    root = await host.register_root("planner", "plans", rules=RULES)
    child = await host.register_child(root.session_id, "explore", "reads code", rules={"parent": "allow"})
    await live(host, root)  # only a session's open run may interrupt (exact live sender)
    return root, child


async def interrupts_for(host, consumer="runner-1", timeout=5.0):
    deadline = asyncio.get_running_loop().time() + timeout
    while asyncio.get_running_loop().time() < deadline:
        found = await host.interrupts.read(consumer, block_ms=200)
        if found:
            return found
    return []


async def of_type(host, session_id, cls):
    return [e for _, e in await host.history(session_id) if isinstance(e, cls)]


async def test_an_interrupt_reaches_the_host_runner_and_the_run_finishes_aborted(stack, calls):
    root, child = await family(stack)
    await stack.start_run(child.session_id, "run-c1")
    result = await stack.interrupts.interrupt_agent(calls.ctx(root.session_id), {"to": child.handle, "reason": "wrong file"})
    assert result["result"] == "interrupt_requested" and result["agent"] == child.handle

    # The runner's side: the trigger, then at the run's next safe point, finish it aborted.
    [trigger] = await interrupts_for(stack)
    assert (trigger.session_id, trigger.run_id, trigger.interrupt_id) == (child.session_id, "run-c1",
                                                                         result["interrupt_id"])
    assert trigger.reason == "wrong file" and trigger.sender_session_id == root.session_id
    assert await stack.interrupts.abort_run(trigger) is True

    [requested] = await of_type(stack, child.session_id, ev.SessionInterruptRequested)
    [finished] = await of_type(stack, child.session_id, ev.SessionRunFinished)
    assert requested.run_id == "run-c1" and requested.sender_handle == root.handle
    assert (finished.run_id, finished.reason) == ("run-c1", "aborted")
    # Acknowledged: no runner sees it again, and the wake runners never saw it at all.
    assert await stack.interrupts.read("runner-2", block_ms=50) == []
    assert await stack.wakes("runner-1", block_ms=50) == []


async def test_a_retried_interrupt_returns_the_first_outcome_and_appends_nothing(stack, calls):
    root, child = await family(stack)
    await stack.start_run(child.session_id, "run-c1")
    ctx = calls.ctx(root.session_id)
    first = await stack.interrupts.interrupt_agent(ctx, {"to": child.handle})
    await stack.finish_run(child.session_id, "run-c1")
    again = await stack.interrupts.interrupt_agent(ctx, {"to": child.handle})
    assert again == first
    assert len(await of_type(stack, child.session_id, ev.SessionInterruptRequested)) == 1
    conflict = await stack.interrupts.interrupt_agent(ctx, {"to": child.handle, "reason": "other"})
    assert conflict["error"]["code"] == "interrupt_agent:idempotency_conflict"
    # The run ended before a runner looked: its trigger is dropped, not handed out.
    assert await stack.interrupts.read("runner-1", block_ms=50) == []


async def test_interrupting_an_idle_session_is_a_no_op_and_a_session_without_rules_has_no_tool(stack, calls):
    root, child = await family(stack)
    await stack.start_run(child.session_id, "run-c1")
    await stack.finish_run(child.session_id, "run-c1")
    before = len(await stack.history(child.session_id))
    result = await stack.interrupts.interrupt_agent(calls.ctx(root.session_id), {"to": child.session_id})
    assert (result["result"], result["reason"], result["recipient_state"]) == ("no_op", "not_running", "idle")
    assert len(await stack.history(child.session_id)) == before
    assert await stack.interrupts.read("runner-1", block_ms=50) == []

    assert (await stack.interrupts.tool_definition(root.session_id))["name"] == "interrupt_agent"
    assert await stack.interrupts.tool_definition(child.session_id) is None
    await stack.start_run(child.session_id, "run-1")  # a live caller, without the tool
    refused = await stack.interrupts.interrupt_agent(calls.ctx(child.session_id), {"to": root.handle})
    assert refused["error"]["code"] == "interrupt_agent:permission_denied"
    invalid = await stack.interrupts.interrupt_agent(calls.ctx(root.session_id), {"to": child.handle, "body": "x"})
    assert invalid["error"]["code"] == "interrupt_agent:invalid_arguments"


async def test_interrupting_an_unknown_handle_is_an_accepted_no_op_that_lists_the_direct_neighbours(stack, calls):
    root = await stack.register_root("planner", "plans", rules=RULES)
    child = await stack.register_child(root.session_id, "explore", "reads code", rules={"interrupt": "allow"})
    sibling = await stack.register_child(root.session_id, "review", "reviews")
    grandchild = await stack.register_child(child.session_id, "grep", "greps")
    await live(stack, child)
    before = [len(await stack.history(s.session_id)) for s in (root, child, sibling, grandchild)]
    result = await stack.interrupts.interrupt_agent(calls.ctx(child.session_id), {"to": "nobody_00000000"})
    assert "error" not in result and (result["result"], result["reason"]) == ("no_op", "absent")
    listing = result["message"]
    assert listing.startswith("nothing was done")
    assert [len(await stack.history(s.session_id)) for s in (root, child, sibling, grandchild)] == before
    assert root.handle in listing and grandchild.handle in listing and sibling.handle not in listing


async def test_an_interrupted_child_stays_resident_and_idle_and_its_mail_waits_in_order_for_a_waking_send(stack,
                                                                                                        calls):
    """Interrupting a running child ends its run aborted, keeps it resident and idle as the same incarnation,
    and holds its accepted mail: handled in order only after a later waking send."""
    root, child = await family(stack)
    await stack.start_run(child.session_id, "run-c1")
    ctx = calls.ctx
    first = await stack.send_message(ctx(root.session_id), {"to": child.handle, "body": "one", "mode": "queue"})
    second = await stack.send_message(ctx(root.session_id), {"to": child.handle, "body": "two", "mode": "queue"})
    await stack.interrupts.interrupt_agent(ctx(root.session_id), {"to": child.handle})
    [trigger] = await interrupts_for(stack)
    assert await stack.interrupts.abort_run(trigger) is True
    # aborted, idle, the same incarnation (never resumed), nothing woken for its mail, the pump included
    [finished] = await of_type(stack, child.session_id, ev.SessionRunFinished)
    assert finished.reason == "aborted"
    assert await of_type(stack, child.session_id, ev.SessionResumed) == []
    await stack.obligations.reconcile()  # what the delivery pump does at start: it wakes nobody either
    assert [w for w in await stack.wakes("runner-1", block_ms=50) if w.session_id == child.session_id] == []
    assert await of_type(stack, child.session_id, ev.SessionWakeRequested) == []
    for sent in (first, second):
        assert (await stack.obligations.inspect(sent["message_id"]))["status"] == "accepted"
    # a later send wakes it, and its run takes the held mail first, in order
    third = await stack.send_message(ctx(root.session_id), {"to": child.handle, "body": "three", "mode": "queue"})
    assert third["recipient_state"] == "queued"
    [wake] = [w for w in await stack.wakes("runner-1", block_ms=2000) if w.session_id == child.session_id]
    assert await stack.wake_run(wake, "run-c2")
    claimed = await stack.claim(child.session_id, "run-c2")
    assert [d.message_id for d in claimed] == [first["message_id"], second["message_id"], third["message_id"]]


async def test_interrupting_a_one_shot_or_settled_child_is_an_accepted_no_op_touching_nothing(stack, calls):
    """An interrupt whose target is absent, settled, one-shot or already completed is an accepted no-op
    touching nothing."""
    root, _ = await family(stack)
    once = await stack.register_child(root.session_id, "once", "runs once", continuable=False)
    gone = await stack.register_child(root.session_id, "gone", "disposed")
    await stack.start_run(once.session_id, "run-1")
    await stack.disposal.dispose(gone.session_id)
    for target, why in ((once, "one_shot"), (gone, "settled")):
        before = await stack.history(target.session_id)
        result = await stack.interrupts.interrupt_agent(calls.ctx(root.session_id), {"to": target.session_id})
        assert (result["result"], result["reason"]) == ("no_op", why), result
        assert await stack.history(target.session_id) == before
    assert await stack.interrupts.read("runner-1", block_ms=50) == []
    # the one-shot child's run goes on, untouched
    assert await stack.finish_run(once.session_id, "run-1") is None


async def test_an_unacknowledged_interrupt_is_reclaimed_by_another_runner(stack, calls):
    root, child = await family(stack)
    await stack.start_run(child.session_id, "run-c1")
    await stack.interrupts.interrupt_agent(calls.ctx(root.session_id), {"to": child.handle})
    [taken] = await interrupts_for(stack, "runner-dies")
    await asyncio.sleep(0.7)  # past reclaim_idle_ms (500 ms in the tests' configuration)
    [reclaimed] = await interrupts_for(stack, "runner-2")
    assert reclaimed.interrupt_id == taken.interrupt_id
    assert await stack.interrupts.abort_run(reclaimed) is True


async def test_interrupt_agent_is_a_row_of_the_tool_registry_every_adapter_serves(stack, calls):
    root, child = await family(stack)
    names = [t["name"] for t in await stack.tools.schemas(root.session_id, "mcp")]
    assert names == ["send_message", "interrupt_agent"]
    assert [t["name"] for t in await stack.tools.schemas(child.session_id, "mcp")] == ["send_message"]
    await stack.start_run(child.session_id, "run-c1")

    result = await stack.tools.call(calls.ctx(root.session_id), "interrupt_agent", {"to": child.handle})

    assert result["result"] == "interrupt_requested"
    refused = await stack.tools.call(calls.ctx(child.session_id), "interrupt_agent", {"to": root.handle})
    assert refused["error"]["code"] == "unknown_tool"


async def test_a_refused_interrupt_is_kept_under_its_tool_call_like_an_accepted_one(stack, calls):
    root, child = await family(stack)
    await stack.start_run(child.session_id, "run-c1")
    ctx = calls.ctx(child.session_id, "run-c1")
    first = await stack.interrupts.interrupt_agent(ctx, {"to": root.handle})  # the child may not interrupt
    assert first["error"]["code"] == "interrupt_agent:permission_denied"
    assert await stack.interrupts.interrupt_agent(ctx, {"to": root.handle}) == first
    # The same call with other arguments is a conflict: the call was decided, not forgotten.
    conflict = await stack.interrupts.interrupt_agent(ctx, {"to": root.handle, "reason": "other"})
    assert conflict["error"]["code"] == "interrupt_agent:idempotency_conflict"
