"""send_message end to end: host API -> command stream -> worker -> Lua append, on a real Valkey."""

import pytest

from treemail.domain.ids import HANDLE_PATTERN

from .conftest import live, running_stack

pytestmark = pytest.mark.cluster


async def family(host, child_rules=None, status="running"):
    rules = child_rules if child_rules is not None else {"parent": "allow", "sibling": "allow"}
    root = await host.register_root("planner", "plans the work", rules={"child": "allow", "*": "allow"})
    a = await host.register_child(root.session_id, "explore", "reads code", rules=rules, status=status)
    b = await host.register_child(root.session_id, "review", "reviews", rules=rules, status=status)
    await live(host, root)
    return root, a, b


def code(result):
    return result.get("error", {}).get("code")


async def accepted_events(host, session_id):
    return [e for _, e in await host.history(session_id) if type(e).__name__ == "ProducerMessageAccepted"]


async def test_child_to_parent_and_sibling_sends_are_accepted(stack, calls):
    root, a, b = await family(stack)
    await live(stack, a)
    to_parent = await stack.send_message(calls.ctx(a.session_id), {"to": root.handle, "body": "found it"})
    to_sibling = await stack.send_message(calls.ctx(a.session_id), {"to": b.session_id, "body": "hi", "mode": "queue"})
    assert to_parent["recipient_state"] == "running" and to_parent["mode"] == "steer"
    assert to_sibling["mode"] == "queue"
    [event] = await accepted_events(stack, root.session_id)
    assert event.body == "found it" and event.sender_handle == a.handle and event.message_id == to_parent["message_id"]


async def test_handles_are_tree_unique_and_well_formed(stack):
    root = await stack.register_root("A Very Long Agent Type Name!!", "x")
    children = [await stack.register_child(root.session_id, "explore", "x") for _ in range(20)]
    handles = [root.handle, *(c.handle for c in children)]
    assert all(HANDLE_PATTERN.match(h) for h in handles)
    assert len(set(handles)) == len(handles)


async def test_recipient_state_reflects_status_at_send_time(stack, calls):
    root, a, _ = await family(stack)
    for status, expected in [("queued", "queued"), ("idle", "queued"), ("finished", "waking_finished"),
                             ("running", "running")]:
        await stack.set_status(a.session_id, status)
        result = await stack.send_message(calls.ctx(root.session_id), {"to": a.handle, "body": status})
        assert result["recipient_state"] == expected
        await stack.discard(a.session_id, result["message_id"], "test")


async def test_addressing_errors(stack, calls):
    root, a, _ = await family(stack)
    other_root = await stack.register_root("planner", "another tree", rules={"child": "allow"})
    other_child = await stack.register_child(other_root.session_id, "explore", "elsewhere")
    await live(stack, a)
    ctx = calls.ctx(a.session_id)
    assert code(await stack.send_message(ctx, {"to": other_root.session_id, "body": "x"})) == "send_message:not_tree_peer"
    assert code(await stack.send_message(calls.ctx(a.session_id), {"to": a.session_id, "body": "x"})) == "send_message:self_send"
    assert code(await stack.send_message(calls.ctx(a.session_id), {"to": a.handle, "body": "x"})) == "send_message:self_send"
    unknown = "01a228af-0000-7000-8000-000000000000"
    assert code(await stack.send_message(calls.ctx(a.session_id), {"to": unknown, "body": "x"})) == "send_message:unknown_session"
    # A handle from another tree never resolves, and the error lists the sender's own peers.
    result = await stack.send_message(calls.ctx(a.session_id), {"to": other_child.handle, "body": "x"})
    message = result["error"]["message"]
    assert message.startswith(f"unknown subagent reference `{other_child.handle}`")
    assert f"{root.handle} — plans the work — running (session_id {root.session_id})" in message
    assert other_child.handle not in message.split("\n", 1)[1]
    # No prefix matching.
    prefix = root.handle[:-2]
    assert code(await stack.send_message(calls.ctx(a.session_id), {"to": prefix, "body": "x"})) == "send_message:unknown_session"


async def test_invalid_arguments_and_body(stack, calls):
    root, a, _ = await family(stack)
    ctx = lambda: calls.ctx(root.session_id)  # noqa: E731
    for bad in [{"to": a.handle}, {"body": "x"}, {"to": a.handle, "body": "x", "extra": 1},
                {"recipient_session_id": a.session_id, "body": "x"}, {"to": 5, "body": "x"},
                {"to": a.handle, "body": "x", "mode": "shout"}, "not json", [1, 2]]:
        assert code(await stack.send_message(ctx(), bad)) == "send_message:invalid_arguments", bad
    assert code(await stack.send_message(ctx(), {"to": a.handle, "body": ""})) == "send_message:invalid_body"
    assert await accepted_events(stack, a.session_id) == []


async def test_body_size_boundary_counts_utf8_bytes(redis_url, calls):
    async with running_stack(redis_url, max_body_bytes=10) as host:
        root, a, _ = await family(host)
        exactly = "é" * 5  # 10 bytes
        assert "message_id" in await host.send_message(calls.ctx(root.session_id), {"to": a.handle, "body": exactly})
        over = "é" * 5 + "x"
        assert code(await host.send_message(calls.ctx(root.session_id), {"to": a.handle, "body": over})) == "send_message:invalid_body"


async def test_disabled_rejects_even_allowed_sends(redis_url, calls):
    async with running_stack(redis_url, enabled=False) as host:
        root, a, _ = await family(host)
        assert code(await host.send_message(calls.ctx(root.session_id), {"to": a.handle, "body": "x"})) == "send_message:disabled"


async def test_inbox_cap_counts_agent_mail_only_and_drains(redis_url, calls):
    async with running_stack(redis_url, max_pending_per_session=2, max_inflight_per_pair=0) as host:
        root, a, b = await family(host)
        await live(host, b)
        for owner in ("plugin", "delegation", "goal"):
            await host.inject(a.session_id, owner, "not agent mail")
        first = await host.send_message(calls.ctx(root.session_id), {"to": a.handle, "body": "1"})
        await host.send_message(calls.ctx(b.session_id), {"to": a.handle, "body": "2"})
        third = await host.send_message(calls.ctx(root.session_id), {"to": a.handle, "body": "3"})
        assert code(third) == "send_message:inbox_full"
        await host.discard(a.session_id, first["message_id"], "not needed")
        assert "message_id" in await host.send_message(calls.ctx(root.session_id), {"to": a.handle, "body": "4"})


async def test_pair_window_admits_four_and_drains_on_consume_not_release(stack, calls):
    root, a, _ = await family(stack)
    ids = []
    for i in range(4):
        ids.append((await stack.send_message(calls.ctx(root.session_id), {"to": a.handle, "body": str(i)}))["message_id"])
    assert code(await stack.send_message(calls.ctx(root.session_id), {"to": a.handle, "body": "5th"})) == "send_message:inflight_full"
    await stack.start_run(a.session_id, "run-a")
    claimed = await stack.claim(a.session_id, "run-a")
    assert [c.message_id for c in claimed] == ids
    await stack.release(a.session_id, ids[0])
    assert code(await stack.send_message(calls.ctx(root.session_id), {"to": a.handle, "body": "x"})) == "send_message:inflight_full"
    await stack.consume(a.session_id, ids[1])
    assert "message_id" in await stack.send_message(calls.ctx(root.session_id), {"to": a.handle, "body": "y"})


async def test_retry_returns_original_message_id_and_appends_once(stack, calls):
    root, a, _ = await family(stack)
    ctx = calls.ctx(root.session_id)
    first = await stack.send_message(ctx, {"to": a.handle, "body": "once"})
    again = await stack.send_message(ctx, {"to": a.handle, "body": "once"})
    assert again == first
    assert len(await accepted_events(stack, a.session_id)) == 1
    conflict = await stack.send_message(ctx, {"to": a.handle, "body": "different"})
    assert code(conflict) == "send_message:idempotency_conflict"
    assert len(await accepted_events(stack, a.session_id)) == 1


async def test_deny_by_default_hides_tool_and_denies(stack, calls):
    root = await stack.register_root("planner", "x", rules={"child": "allow"})
    mute = await stack.register_child(root.session_id, "explore", "no rules")
    await live(stack, root, mute)
    assert await stack.tool_definition(mute.session_id) is None
    assert (await stack.tool_definition(root.session_id))["name"] == "send_message"
    result = await stack.send_message(calls.ctx(mute.session_id), {"to": root.handle, "body": "x"})
    assert code(result) == "permission_denied"
    denied_parent = await stack.send_message(calls.ctx(root.session_id), {"to": mute.handle, "body": "x"})
    assert "message_id" in denied_parent


async def test_ask_waits_for_approval_once_tree_and_deny(stack, calls):
    import asyncio

    root = await stack.register_root("planner", "x", rules={"child": "allow"})
    rules = {"parent": "allow", "sibling": "ask"}
    a = await stack.register_child(root.session_id, "explore", "a", rules=rules)
    b = await stack.register_child(root.session_id, "review", "b", rules=rules)
    await live(stack, a, b)

    async def approve_next(decision):
        while True:
            pending = await stack.permissions.pending_approvals()
            if pending:
                request = pending[0]
                assert request["sender_session_id"] == a.session_id and request["label"] == "sibling"
                if decision == "deny":
                    return await stack.permissions.deny(request["request_id"])
                return await stack.permissions.approve(request["request_id"], scope=decision)
            await asyncio.sleep(0.02)

    send = stack.send_message(calls.ctx(a.session_id), {"to": b.handle, "body": "approved once"})
    result, _ = await asyncio.gather(send, approve_next("once"))
    assert "message_id" in result

    send = stack.send_message(calls.ctx(a.session_id), {"to": b.handle, "body": "denied"})
    result, _ = await asyncio.gather(send, approve_next("deny"))
    assert code(result) == "permission_denied"

    send = stack.send_message(calls.ctx(a.session_id), {"to": b.handle, "body": "for the tree"})
    result, _ = await asyncio.gather(send, approve_next("tree"))
    assert "message_id" in result
    # The tree grant lets later sibling sends through without asking.
    result = await asyncio.wait_for(stack.send_message(calls.ctx(b.session_id), {"to": a.handle, "body": "x"}), 5)
    assert "message_id" in result
    assert await stack.permissions.pending_approvals() == []
    # Approvals are events on the sender's stream: history (and so replay) shows each request and answer.
    approval_events = [type(e).__name__ for _, e in await stack.history(a.session_id) if "Approval" in type(e).__name__]
    assert approval_events == ["ApprovalRequested", "ApprovalGranted", "ApprovalRequested", "ApprovalDenied",
                               "ApprovalRequested", "ApprovalGranted"]


async def test_an_approved_tool_call_resent_to_another_recipient_or_body_is_a_conflict(stack, calls):
    import asyncio

    root = await stack.register_root("planner", "x", rules={"child": "allow"})
    rules = {"parent": "allow", "sibling": "ask"}
    a = await stack.register_child(root.session_id, "explore", "a", rules=rules)
    b = await stack.register_child(root.session_id, "review", "b", rules=rules)
    c = await stack.register_child(root.session_id, "test", "c", rules=rules)
    await live(stack, a)
    ctx = calls.ctx(a.session_id)

    async def approve_first():
        while not (pending := await stack.permissions.pending_approvals()):
            await asyncio.sleep(0.02)
        await stack.permissions.approve(pending[0]["request_id"], scope="once")

    result, _ = await asyncio.gather(stack.send_message(ctx, {"to": b.handle, "body": "one"}), approve_first())
    assert "message_id" in result
    for other in ({"to": c.handle, "body": "one"}, {"to": b.handle, "body": "two"}):
        again = await asyncio.wait_for(stack.send_message(ctx, other), 5)
        assert code(again) == "send_message:idempotency_conflict"
    assert [m.message_id for m in await stack.obligations.pending_mail(c.session_id)] == []


async def test_illegal_lifecycle_transitions_change_nothing(stack, calls):
    from treemail.domain.errors import LifecycleError

    root, a, _ = await family(stack)
    sent = await stack.send_message(calls.ctx(root.session_id), {"to": a.handle, "body": "x"})
    before = await stack.history(a.session_id)
    with pytest.raises(LifecycleError) as consumed:
        await stack.consume(a.session_id, sent["message_id"])
    assert consumed.value.code == "lifecycle:not_claimed"
    with pytest.raises(LifecycleError) as unknown:
        await stack.discard(a.session_id, "01a228af-0000-7000-8000-000000000001")
    assert unknown.value.code == "lifecycle:unknown_message"
    with pytest.raises(LifecycleError) as not_current:
        await stack.claim(a.session_id, "no-such-run")
    assert not_current.value.code == "lifecycle:not_current_run"
    assert await stack.history(a.session_id) == before


async def test_closing_client_answers_pending_sends_engine_shutdown(redis_url, calls):
    import asyncio

    from treemail.host import Treemail

    from .conftest import make_config

    # No worker runs: the send stays undecided until the client closes.
    config = make_config(redis_url)
    host = await Treemail.connect(config, redis_url)
    root, a, _ = await family(host)
    pending = asyncio.ensure_future(host.send_message(calls.ctx(root.session_id), {"to": a.handle, "body": "x"}))
    await asyncio.sleep(0.2)
    await host.close()
    result = await pending
    assert code(result) == "send_message:engine_shutdown"
    assert "Retrying this same tool call is safe" in result["error"]["message"]


async def test_undecided_command_is_decided_by_a_later_worker_with_the_same_key(redis_url, calls):
    """engine_shutdown, then a retry of the same tool call once workers run: delivered exactly once."""
    from treemail.host import Treemail

    from .conftest import make_config

    config = make_config(redis_url)
    config = config.model_copy(update={"service": config.service.model_copy(update={"decision_timeout_s": 0.3})})
    host = await Treemail.connect(config, redis_url)
    root, a, _ = await family(host)
    ctx = calls.ctx(root.session_id)
    assert code(await host.send_message(ctx, {"to": a.handle, "body": "late"})) == "send_message:engine_shutdown"
    await host.close()
    async with running_stack(redis_url) as live:
        result = await live.send_message(ctx, {"to": a.handle, "body": "late"})
        assert "message_id" in result
        assert len(await accepted_events(live, a.session_id)) == 1
