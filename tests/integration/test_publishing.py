"""The command client publishes concurrent sends together: one pipeline per turn of the event loop, not a
connection, a write and a round trip each.

The client is built by the test from the Redis URL, as the host builds its own, so its connections
and its routing can be watched; a stack's worker decides what it publishes.
"""

import asyncio
import contextlib

import pytest

from treemail.adapters.connection import connect
from treemail.domain.commands import SendArguments
from treemail.host import SendContext
from treemail.adapters.commandclient import CommandClient

from .conftest import CLUSTER, adapters

pytestmark = pytest.mark.cluster


def connections_opened(redis) -> int:
    if CLUSTER:
        return sum(len(node._connections) for node in redis.get_nodes())
    pool = redis.connection_pool
    return len(pool._in_use_connections) + len(pool._available_connections)


@contextlib.asynccontextmanager
async def command_client(host):
    """A command client on connections of its own, configured as ``host``'s stack."""
    config = adapters(host).config
    redis = await connect(config.service.redis_url, config.service)
    listener = await connect(config.service.redis_url, config.service)
    client = CommandClient(redis, listener, config.service, adapters(host).store.directory)
    try:
        yield client, redis
    finally:
        await client.close()
        await listener.aclose()
        await redis.aclose()


def decided(outcome: dict) -> dict:
    """What ``send_message`` returns for a client's outcome."""
    return outcome.get("ok", outcome)


async def test_a_burst_of_sends_is_published_over_one_connection_and_every_send_is_answered(stack, calls):
    root = await stack.register_root("planner", "plans", rules={"child": "allow"})
    children = [await stack.register_child(root.session_id, "explore", f"child {i}", rules={"parent": "allow"})
                for i in range(4)]
    await stack.start_run(root.session_id, "run-1")
    async with command_client(stack) as (client, redis):
        before = connections_opened(redis)

        results = [decided(r) for r in await asyncio.gather(*[
            client.request(calls.ctx(root.session_id), SendArguments(children[i % 4].handle, f"m{i}"))
            for i in range(200)
        ])]

        # Every send was decided by a worker (accepted, or refused by the pair window), none lost on the way.
        undecided = [r for r in results if "message_id" not in r and "message_id" not in r["error"]]
        assert not undecided, undecided[:3]
        # 200 sends at once used to open up to 32 connections to publish.
        assert connections_opened(redis) - before <= 2


async def test_a_send_whose_publishing_fails_is_answered_engine_shutdown_and_the_next_send_goes_through(stack, calls):
    root = await stack.register_root("planner", "plans", rules={"child": "allow"})
    child = await stack.register_child(root.session_id, "explore", "reads", rules={"parent": "allow"})
    await stack.start_run(root.session_id, "run-1")
    async with command_client(stack) as (client, _):
        real_stream_for = client.stream_for
        # A command stream key that holds a string: the server refuses the XADD (WRONGTYPE) for this send only.
        await adapters(stack).redis.set("tm:not-a-stream", "x")
        client.stream_for = lambda context, root=None: (
            "tm:not-a-stream" if context.tool_call_id == "bad" else real_stream_for(context, root))

        bad, good = [decided(r) for r in await asyncio.gather(
            client.request(SendContext(root.session_id, "run-1", "bad"), SendArguments(child.handle, "lost")),
            client.request(calls.ctx(root.session_id), SendArguments(child.handle, "kept")),
        )]

        assert bad["error"]["code"] == "send_message:engine_shutdown"
        assert "message_id" in good
