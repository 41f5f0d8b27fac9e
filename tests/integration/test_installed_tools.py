"""Tools installed one by one: the optional model-facing tools reach a session's model, through the
host API and every adapter that serves the tool registry, only once its host installs them, and then only
where a grant allows; the installation is an event on the session's stream."""

import pytest

from treemail.domain import events as ev
from treemail.domain.errors import LifecycleError

from .conftest import live

pytestmark = pytest.mark.cluster


async def names(host, session_id) -> list[str]:
    return [t["name"] for t in await host.tools.schemas(session_id, "mcp")]


async def test_installed_tools_are_offered_called_and_recorded(stack, calls):
    root = await stack.register_root("planner", "plans", rules={"child": "allow"})
    child = await stack.register_child(root.session_id, "explore", "reads", rules={"parent": "allow"})
    await live(stack, root)
    assert await names(stack, root.session_id) == ["send_message"]
    refused = await stack.tools.call(calls.ctx(root.session_id), "inspect_message", {"message_id": "m"})
    assert refused["error"]["code"] == "unknown_tool"

    assert await stack.tools.install(root.session_id, ["retry_message", "inspect_message"]) == [
        "inspect_message", "retry_message"]
    assert await names(stack, root.session_id) == ["send_message", "inspect_message", "retry_message"]
    sent = await stack.tools.call(calls.ctx(root.session_id), "send_message", {"to": child.handle, "body": "hi"})
    status = await stack.tools.call(calls.ctx(root.session_id), "inspect_message", {"message_id": sent["message_id"]})
    assert status["status"] == "accepted"
    # The child did not get them: installation is per session.
    assert await names(stack, child.session_id) == ["send_message"]

    assert await stack.tools.install(root.session_id, []) == []
    assert await names(stack, root.session_id) == ["send_message"]
    installs = [e.tools for _, e in await stack.history(root.session_id) if isinstance(e, ev.ToolsInstalled)]
    assert installs == [["inspect_message", "retry_message"], []]


async def test_a_peer_tool_needs_both_its_installation_and_a_grant(stack):
    planner = await stack.register_root("planner", "plans", rules={})
    advisor = await stack.register_root("advisor", "reviews", rules={}, status="idle")
    await stack.tools.install(planner.session_id, ["send_to_peer"])
    assert await names(stack, planner.session_id) == []  # installed, but no route grants a send yet

    await stack.peers.register_route("advisor", advisor.session_id, source_session_id=planner.session_id)
    await stack.peers.set_grant(advisor.session_id, source_session_id=planner.session_id, send=True)
    assert await names(stack, planner.session_id) == ["send_to_peer"]


async def test_an_unknown_tool_name_is_refused_and_changes_nothing(stack):
    root = await stack.register_root("planner", "plans", rules={"child": "allow"})
    before = await stack.history(root.session_id)
    with pytest.raises(LifecycleError) as refused:
        await stack.tools.install(root.session_id, ["inspect_message", "rm_rf"])
    assert refused.value.code == "lifecycle:unknown_tool" and "rm_rf" in refused.value.message
    # Many long names: a few named, each in part, and the rest counted.
    with pytest.raises(LifecycleError) as refused:
        await stack.tools.install(root.session_id, [f"{n}" + "y" * 100_000 for n in range(15)])
    assert refused.value.message.startswith("no installable tool named '0yyy") and " and 10 more; one of " in (
        refused.value.message) and len(refused.value.message) < 600
    assert await stack.history(root.session_id) == before
    with pytest.raises(ValueError):
        await stack.tools.install(root.session_id, "inspect_message")
