"""A worker decides on the states it already holds and keeps a decision only if its own append
checks every state it read: what another writer changed meanwhile is decided again on fresh state."""

import pytest

from treemail.adapters import keys
from treemail.domain import events as ev
from treemail.host import SendContext

from .conftest import adapters, running_stack

pytestmark = pytest.mark.cluster


async def test_a_refusal_decided_on_held_states_is_decided_again_once_the_senders_record_changed(redis_url, calls):
    async with running_stack(redis_url, max_pending_per_session=1, max_inflight_per_pair=0) as host:
        root = await host.register_root("planner", "plans", rules={"child": "allow"})
        child = await host.register_child(root.session_id, "explore", "reads", rules={"parent": "allow"})
        await host.start_run(root.session_id, "run-1")
        first = await host.send_message(calls.ctx(root.session_id), {"to": child.handle, "body": "one"})
        # The worker holds the child with its inbox full; the host empties it (consuming settles the
        # message on the root's stream: the sender's record the refusal would append to has changed).
        await host.start_run(child.session_id, "run-c")
        [delivery] = await host.claim(child.session_id, "run-c")
        await host.consume(child.session_id, delivery.message_id)

        second = await host.send_message(calls.ctx(root.session_id), {"to": child.handle, "body": "two"})

        assert delivery.message_id == first["message_id"]
        assert "message_id" in second, second  # not inbox_full: decided on the state the host left


async def test_a_send_decided_on_a_held_recipient_another_writer_changed_is_decided_again(stack, calls):
    root = await stack.register_root("planner", "plans", rules={"child": "allow"})
    child = await stack.register_child(root.session_id, "explore", "reads", rules={"parent": "allow"})
    await stack.start_run(root.session_id, "run-1")
    first = await stack.send_message(calls.ctx(root.session_id), {"to": child.handle, "body": "one"})
    await stack.start_run(child.session_id, "run-c")  # the host appends to the recipient only

    second = await stack.send_message(calls.ctx(root.session_id), {"to": child.handle, "body": "two"})

    assert (first["recipient_state"], second["recipient_state"]) == ("queued", "running")


async def test_a_retried_tool_call_decided_on_held_states_gets_its_first_answer_and_sends_once(stack):
    root = await stack.register_root("planner", "plans", rules={"child": "allow"})
    child = await stack.register_child(root.session_id, "explore", "reads", rules={"parent": "allow"})
    await stack.start_run(root.session_id, "run-1")
    context = SendContext(root.session_id, "run-1", "call-1")

    first = await stack.send_message(context, {"to": child.handle, "body": "once"})
    again = await stack.send_message(context, {"to": child.handle, "body": "once"})

    assert again == first
    accepted = [e for _, e in await stack.history(child.session_id) if isinstance(e, ev.ProducerMessageAccepted)]
    assert len(accepted) == 1


async def test_a_send_after_the_drain_began_is_refused_though_the_worker_held_every_state(stack, calls):
    root = await stack.register_root("planner", "plans", rules={"child": "allow"})
    child = await stack.register_child(root.session_id, "explore", "reads", rules={"parent": "allow"})
    await stack.start_run(root.session_id, "run-1")
    assert "message_id" in await stack.send_message(calls.ctx(root.session_id), {"to": child.handle, "body": "a"})

    await stack.disposal.drain()
    refused = await stack.send_message(calls.ctx(root.session_id), {"to": child.handle, "body": "b"})
    await stack.disposal.undrain()
    after = await stack.send_message(calls.ctx(root.session_id), {"to": child.handle, "body": "c"})

    assert refused["error"]["code"] == "send_message:draining"
    assert "message_id" in after
    partition = (await adapters(stack).sessions.record(child.session_id)).partition
    assert not await adapters(stack).redis.exists(keys.partition_drain(partition))  # the copies go with the flag
