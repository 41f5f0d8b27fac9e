import pytest

pytestmark = pytest.mark.cluster


async def test_parent_sends_to_child(stack, calls):
    root = await stack.register_root("planner", "plans", rules={"child": "allow"})
    child = await stack.register_child(root.session_id, "explore", "reads code", rules={"parent": "allow"})
    await stack.start_run(root.session_id, "run-1")
    result = await stack.send_message(calls.ctx(root.session_id), {"to": child.handle, "body": "hello"})
    assert set(result) == {"message_id", "mode", "recipient_state"}, result
    assert result["recipient_state"] == "queued"
    history = await stack.history(child.session_id)
    assert [type(e).__name__ for _, e in history] == [
        "SessionRegistered", "ProducerRegistered", "ProducerMessageAccepted"
    ]
    # the host may ask for the number in the pair; a model's plain result never carries it
    asked = await stack.send_message(calls.ctx(root.session_id), {"to": child.handle, "body": "again"}, numbered=True)
    assert set(asked) == {"message_id", "mode", "recipient_state", "sequence"} and asked["sequence"] == 2
