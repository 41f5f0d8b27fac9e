"""A cluster placed by the slot plan: each master owns the slots the plan gives it, and the trees' keys and
the command streams live on the masters the plan names for their tags."""

import pytest
import redis
import redis.asyncio as aioredis
from redis.exceptions import MovedError

from treemail.adapters import keys, slotplan
from treemail.adapters.embedded import LocalValkeyCluster
from treemail.host import SendContext

from ..conftest import CLUSTER
from .conftest import make_config, running_stack

pytestmark = [pytest.mark.cluster,
              pytest.mark.skipif(not CLUSTER, reason="the cluster suite's: starts a cluster of its own")]


def shards(port: int) -> dict[int, list[tuple[int, int]]]:
    """CLUSTER SHARDS as the nodes report it: each master's port -> its slot ranges."""
    out = {}
    with redis.Redis(host="127.0.0.1", port=port, decode_responses=True) as client:
        for shard in client.execute_command("CLUSTER", "SHARDS"):
            shard = dict(zip(shard[::2], shard[1::2])) if isinstance(shard, list) else shard
            nodes = [dict(zip(n[::2], n[1::2])) if isinstance(n, list) else n for n in shard["nodes"]]
            master = next(n for n in nodes if n["role"] == "master")
            flat = [int(s) for s in shard["slots"]]
            out[int(master["port"])] = sorted(zip(flat[::2], flat[1::2]))
    return out


async def test_a_planned_cluster_holds_each_partition_where_the_plan_says():
    config = make_config("redis://unused")
    plan = slotplan.plan(3, config.service.partitions, config.service.command_streams)
    cluster = LocalValkeyCluster(masters=3, plan=plan).start()
    try:
        ports = [node.port for node in cluster.nodes]
        assert shards(ports[0]) == {port: list(m.ranges) for port, m in zip(ports, plan.masters)}

        config = make_config(cluster.url)
        async with running_stack(cluster.url, config=config) as host:
            roots = [await host.register_root("planner", "plans", rules={"child": "allow"}) for _ in range(6)]
            child = await host.register_child(roots[0].session_id, "explore", "reads", rules={"parent": "allow"})
            await host.start_run(roots[0].session_id, "run-1")
            sent = await host.send_message(SendContext(roots[0].session_id, "run-1", "call-1"),
                                           {"to": child.handle, "body": "look here"})
            assert "message_id" in sent, sent

            partitions = config.service.partitions
            expected = {}
            for record in roots + [child]:
                p = keys.partition_of(record.root_session_id, partitions)
                expected[keys.session_stream(p, record.session_id)] = plan.owner(slotplan.partition_slot(p))
            for index in range(config.service.command_streams):
                expected[keys.command_stream(index)] = plan.owner(slotplan.stream_slot(index))
            assert len({m for m in expected.values()}) > 1  # the keys span masters: the test can tell them apart
            for key, master in expected.items():
                # Asked directly (no cluster client): only the owning node holds the key, the others redirect.
                async with aioredis.Redis(host="127.0.0.1", port=ports[master]) as node:
                    assert await node.exists(key) == 1, key
                other = ports[(master + 1) % 3]
                async with aioredis.Redis(host="127.0.0.1", port=other) as node:
                    with pytest.raises(MovedError) as moved:
                        await node.exists(key)
                assert moved.value.port == ports[master]
    finally:
        cluster.cleanup()
