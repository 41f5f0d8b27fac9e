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

# The cluster suite's (each starts a cluster of its own, so it runs once, not in the single-server suite too).
OWN_CLUSTER = pytest.mark.skipif(not CLUSTER, reason="starts a cluster of its own: run in the cluster suite")


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


def settled(cluster, timeout: float = 10.0) -> None:
    """Until every node reports the same slots (the moves' new owners reach the others by gossip)."""
    import time

    deadline = time.monotonic() + timeout
    while len({str(sorted(shards(node.port).items())) for node in cluster.nodes}) > 1:
        assert time.monotonic() < deadline, "the nodes never agreed on the slots"
        time.sleep(0.05)


@pytest.mark.cluster
@OWN_CLUSTER
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


def migrate(move: dict, timeout: float = 30.0) -> str:
    """One printed move, run on its source; waits for the migration job to end and returns its state."""
    import time

    source = move["source_node"]
    with redis.Redis(host=source["host"], port=source["port"], decode_responses=True) as node:
        node.execute_command("CLUSTER", "MIGRATESLOTS", "SLOTSRANGE", move["first"], move["last"],
                             "NODE", move["target_node"]["id"])
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for job in node.execute_command("CLUSTER", "GETSLOTMIGRATIONS"):
                job = dict(zip(job[::2], job[1::2])) if isinstance(job, list) else job
                if (job["operation"] == "EXPORT" and job["slot_ranges"] == f"{move['first']}-{move['last']}"
                        and job["state"] in ("success", "failed", "cancelled")):
                    return job["state"]
            time.sleep(0.05)
    return "timed out"


@pytest.mark.cluster
@OWN_CLUSTER
def test_the_live_moves_bring_an_evenly_split_cluster_to_the_plan(monkeypatch, capsys):
    """`cluster-plan --live` on a running cluster split evenly: its MIGRATESLOTS moves, run one by one as
    printed, leave the cluster holding the plan, the trees' keys moved with their partitions; asked again, it
    has nothing left to move (a move that failed under load would be listed again: run what is left)."""
    import json

    from treemail.entrypoints.cli import main

    cluster = LocalValkeyCluster(masters=3).start()
    try:
        monkeypatch.setenv("REDIS_URL", cluster.url)
        monkeypatch.delenv("TREEMAIL_CONFIG", raising=False)
        plan = slotplan.plan(3, 16, 4)
        client = redis.RedisCluster.from_url(cluster.url)
        for p in range(16):
            client.set(f"{keys.feed(p)}:probe", p)
        client.close()
        for attempt in range(3):
            assert main(["cluster-plan", "--live", "--json"]) == 0
            moves = json.loads(capsys.readouterr().out)["from_live"]
            if attempt == 0:
                assert any(m["partitions"] for m in moves)
            if not moves:
                break
            states = [migrate(move) for move in moves]
            settled(cluster)
            if attempt == 0 and set(states) != {"success"}:
                print(f"moves left after the first round: {states}")
        assert main(["cluster-plan", "--live"]) == 0
        assert "this cluster already holds this plan: nothing to move." in capsys.readouterr().out
        assert sorted(shards(cluster.nodes[0].port).values()) == sorted(sorted(m.ranges) for m in plan.masters)
        client = redis.RedisCluster.from_url(cluster.url)
        assert [int(client.get(f"{keys.feed(p)}:probe")) for p in range(16)] == list(range(16))
        layout = shards(cluster.nodes[0].port)
        for p in range(16):
            node = client.get_node_from_key(keys.feed(p))
            assert layout[node.port] == sorted(plan.masters[plan.owner(slotplan.partition_slot(p))].ranges)
        client.close()
    finally:
        cluster.cleanup()


@pytest.mark.skipif(CLUSTER, reason="needs a server that is not a cluster")
def test_live_on_a_server_that_is_not_a_cluster_is_one_line(valkey, monkeypatch, capsys):
    from treemail.entrypoints.cli import main

    monkeypatch.setenv("REDIS_URL", valkey.url)
    monkeypatch.delenv("TREEMAIL_CONFIG", raising=False)
    assert main(["cluster-plan", "--live"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--live reads a Redis/Valkey Cluster's slots" in err, err
