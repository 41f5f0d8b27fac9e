"""routing = "direct" through the real stack: the routing table, the candidate list, the reply hint."""

import pytest

from .conftest import live, running_stack

pytestmark = pytest.mark.cluster

OPEN = {"*": "allow"}


def code(result):
    return result.get("error", {}).get("code")


async def test_direct_routing_end_to_end(redis_url, calls):
    async with running_stack(redis_url, routing="direct") as host:
        root = await host.register_root("planner", "plans", rules=OPEN)
        resident = await host.register_child(root.session_id, "explore", "reads", rules=OPEN, status="running")
        one_shot = await host.register_child(root.session_id, "review", "reviews", rules=OPEN, status="running",
                                             resident=False, continuable=False)
        grandchild = await host.register_child(resident.session_id, "grep", "greps", rules=OPEN)
        await live(host, root, resident, one_shot, grandchild)  # only a session's open run may send (exact live sender)

        # Resident child -> parent; parent -> child (resident or not): routed.
        assert "message_id" in await host.send_message(calls.ctx(resident.session_id), {"to": root.handle, "body": "a"})
        assert "message_id" in await host.send_message(calls.ctx(root.session_id), {"to": one_shot.handle, "body": "b"})
        # Non-resident child -> parent: refused (not_resident_child).
        refused = await host.send_message(calls.ctx(one_shot.session_id), {"to": root.handle, "body": "c"})
        assert code(refused) == "send_message:not_resident_child"
        assert refused["error"]["message"] == (
            f'agent "{one_shot.session_id}" is not a resident continuable child and cannot send to parent '
            f'"{root.session_id}"'
        )
        # Anything else, although every rule allows it.
        for sender, target in [(resident, one_shot), (root, grandchild), (grandchild, root)]:
            result = await host.send_message(calls.ctx(sender.session_id), {"to": target.handle, "body": "d"})
            assert code(result) == "send_message:not_direct_neighbour"

        # The candidate list shows only the direct neighbours.
        listing = (await host.send_message(calls.ctx(resident.session_id), {"to": "nobody_00000000", "body": "e"}))
        message = listing["error"]["message"]
        assert root.handle in message and grandchild.handle in message and one_shot.handle not in message

        # The tool says so; and a child that cannot answer its parent is not told to.
        definition = await host.tool_definition(root.session_id)
        assert "direct continuable child" in definition["input_schema"]["properties"]["to"]["description"]
        [delivery] = await host.claim(one_shot.session_id, "run-1")
        assert "to reply" not in delivery.text
        [from_child] = await host.claim(root.session_id, "run-1")
        assert f'send_message(to="{resident.handle}"' in from_child.text
