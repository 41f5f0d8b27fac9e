"""The host publishes concurrent sends together: one pipeline per turn of the event loop, not a
connection, a write and a round trip each."""

import asyncio

import pytest

from treemail.host import SendContext

from .conftest import CLUSTER

pytestmark = pytest.mark.cluster


def connections_opened(host) -> int:
    if CLUSTER:
        return sum(len(node._connections) for node in host.redis.get_nodes())
    pool = host.redis.connection_pool
    return len(pool._in_use_connections) + len(pool._available_connections)


async def test_a_burst_of_sends_is_published_over_one_connection_and_every_send_is_answered(stack, calls):
    root = await stack.register_root("planner", "plans", rules={"child": "allow"})
    children = [await stack.register_child(root.session_id, "explore", f"child {i}", rules={"parent": "allow"})
                for i in range(4)]
    await stack.start_run(root.session_id, "run-1")
    before = connections_opened(stack)

    results = await asyncio.gather(*[
        stack.send_message(calls.ctx(root.session_id), {"to": children[i % 4].handle, "body": f"m{i}"})
        for i in range(200)
    ])

    # Every send was decided by a worker (accepted, or refused by the pair window), none lost on the way.
    undecided = [r for r in results if "message_id" not in r and "message_id" not in r["error"]]
    assert not undecided, undecided[:3]
    # 200 sends at once used to open up to 32 connections to publish.
    assert connections_opened(stack) - before <= 2


async def test_a_send_whose_publishing_fails_is_answered_engine_shutdown_and_the_next_send_goes_through(stack, calls):
    root = await stack.register_root("planner", "plans", rules={"child": "allow"})
    child = await stack.register_child(root.session_id, "explore", "reads", rules={"parent": "allow"})
    await stack.start_run(root.session_id, "run-1")
    client = stack.commands
    real_stream_for = client.stream_for
    # A command stream key that holds a string: the server refuses the XADD (WRONGTYPE) for this send only.
    await stack.redis.set("tm:not-a-stream", "x")
    client.stream_for = lambda context, root=None: (
        "tm:not-a-stream" if context.tool_call_id == "bad" else real_stream_for(context, root))

    bad, good = await asyncio.gather(
        stack.send_message(SendContext(root.session_id, "run-1", "bad"), {"to": child.handle, "body": "lost"}),
        stack.send_message(calls.ctx(root.session_id), {"to": child.handle, "body": "kept"}),
    )

    assert bad["error"]["code"] == "send_message:engine_shutdown"
    assert "message_id" in good
