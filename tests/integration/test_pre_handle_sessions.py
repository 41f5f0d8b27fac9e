"""Sessions registered without a handle (pre-handle sessions) on a real Valkey: UUID addressing end to end."""

import pytest

from treemail.adapters.wakes import WakeReader
from treemail.projections.replay import rebuild

from .conftest import adapters, live

pytestmark = pytest.mark.cluster


async def test_a_pre_handle_session_is_addressed_and_replied_to_by_its_uuid(stack, calls):
    root = await stack.register_root("planner", "plans", rules={"*": "allow"}, status="running")
    old = await stack.register_child(root.session_id, "explore", "registered before handles", rules={"*": "allow"},
                                     status="running", with_handle=False)
    assert old.handle is None
    await live(stack, root, old)  # only a session's open run may send (exact live sender)

    to_old = await stack.send_message(calls.ctx(root.session_id), {"to": old.session_id, "body": "status?"})
    assert "message_id" in to_old
    await stack.send_message(calls.ctx(old.session_id), {"to": root.session_id, "body": "all good"})
    await stack.start_run(root.session_id, "run-1")
    [delivery] = await stack.claim(root.session_id, "run-1")

    assert delivery.text == (
        f'<agent_message from="{old.session_id}">\nall good\n\n'
        f'[use `send_message(to="{old.session_id}", ...)` to reply]\n</agent_message>'
    )
    reply = await stack.send_message(calls.ctx(root.session_id, "run-1"), {"to": old.session_id, "body": "thanks"})
    assert "message_id" in reply


async def test_the_candidate_list_prints_a_pre_handle_peer_by_its_uuid_once(stack, calls):
    root = await stack.register_root("planner", "plans", rules={"*": "allow"}, status="running")
    old = await stack.register_child(root.session_id, "explore", "old reader", rules={"*": "allow"},
                                     with_handle=False)
    new = await stack.register_child(root.session_id, "review", "new reviewer", rules={"*": "allow"})
    await live(stack, root)

    result = await stack.send_message(calls.ctx(root.session_id), {"to": "explore_deadbeef", "body": "hi"})

    message = result["error"]["message"]
    assert result["error"]["code"] == "send_message:unknown_session"
    assert f"- {old.session_id} — old reader — queued" in message.splitlines()
    assert message.count(old.session_id) == 1
    assert f"{new.handle} — new reviewer — queued (session_id {new.session_id})" in message


async def test_a_pre_handle_session_joins_its_tree_for_reconcile_and_replay(stack, calls):
    root = await stack.register_root("planner", "plans", rules={"*": "allow"}, status="running", with_handle=False)
    old = await stack.register_child(root.session_id, "explore", "x", rules={"*": "allow"}, status="idle",
                                     with_handle=False)
    await live(stack, root)
    await stack.send_message(calls.ctx(root.session_id), {"to": old.session_id, "body": "wake up"})
    [first] = await stack.wakes("runner-1", block_ms=2000)
    await WakeReader(adapters(stack).redis, adapters(stack).config.service).ack(first)  # woken, never run

    assert await stack.obligations.reconcile() == 1  # it is among the partition's sessions, so reconcile finds it
    record = await adapters(stack).sessions.record(old.session_id)
    members = await adapters(stack).store.directory.tree_members(record.partition, root.session_id)
    assert set(members) == {root.session_id, old.session_id}
    views = await rebuild(adapters(stack).store, [record.partition], write=False)
    assert views[("inbox", record.partition)][old.session_id] == "1"
    assert views[("trees", record.partition)][f"{root.session_id}:sessions"] == "2"
