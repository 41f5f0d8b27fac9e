"""Scale-out: decisions/s with 1, 2, 4 worker processes, on one Valkey and on a local 3-master cluster.

Both use several command streams (`keys.command_stream(i)`), each command on
stream crc32(the sender's root) % n as treemail/adapters/commandclient.py routes it, so on the cluster the
ingress is spread over several slots, and the trees over the `{pN}` partitions.

Routing (`run_routing`): 2 workers, one Valkey, the trees' mail going both ways (children report to their
roots), put on the streams by tree as producers do now and by sender as earlier releases did.
"""

import asyncio
import time

import redis.asyncio as aioredis
from redis.asyncio.cluster import RedisCluster

from treemail.adapters import keys
from treemail.adapters.config import Config, MessagingConfig, ServiceConfig
from treemail.host import Treemail

from . import masters as per_master
from .common import MAX_OUTSTANDING, Workers, flush_sync, count_replies, prefill_commands, timed_drain


def config(url: str, streams: int, cluster: bool) -> Config:
    return Config(
        messaging=MessagingConfig(max_pending_per_session=1_000_000_000, max_inflight_per_pair=0,
                                  max_outstanding_per_source=MAX_OUTSTANDING),
        service=ServiceConfig(redis_url=url, command_streams=streams, cluster=cluster),
    )


def client(url: str, cluster: bool):
    return RedisCluster.from_url(url) if cluster else aioredis.Redis.from_url(url)


async def balanced_trees(host: Treemail, trees: int, children: int, streams: int, children_send: bool = False,
                         partitions: int = 16) -> list[tuple[str, list[str]]]:
    """`trees` roots spread evenly over the command streams and over the partitions alike, so each master's
    share of the work is the share of the partitions and streams it holds (roots whose stream or partition
    is full are left unused); ``children_send``: the children's runs are open too (only a session's open run
    may send: exact live sender)."""
    per_stream, per_partition = -(-trees // streams), -(-trees // partitions)
    roots: dict[int, list[str]] = {i: [] for i in range(streams)}
    taken = [0] * partitions
    for _ in range(50 * trees):
        if sum(taken) >= trees:
            break
        root = await host.register_root("planner", "root", rules={"child": "allow", "parent": "allow"},
                                        status="running")
        index = keys.command_shard(root.session_id, streams)
        partition = keys.partition_of(root.session_id, partitions)
        if len(roots[index]) < per_stream and taken[partition] < per_partition:
            roots[index].append(root.session_id)
            taken[partition] += 1
    if sum(taken) < trees:
        raise RuntimeError(f"no spread of {trees} trees over {streams} streams and {partitions} partitions")
    out = []
    for root in [r for v in roots.values() for r in v]:
        kids = await asyncio.gather(*[
            host.register_child(root, "worker", f"child {c}", rules={"parent": "allow"}, status="running")
            for c in range(children)
        ])
        await host.start_run(root, "run-1")  # only a session's open run may send (exact live sender)
        if children_send:
            await asyncio.gather(*[host.start_run(kid.session_id, "run-1") for kid in kids])
        out.append((root, [k.session_id for k in kids]))
    return out


async def flush(url: str, cluster: bool) -> None:
    r = client(url, cluster)
    try:
        if cluster:
            await flush_sync(r, target_nodes=RedisCluster.PRIMARIES)
        else:
            await flush_sync(r)
    finally:
        await r.aclose()


async def run_routing(url: str, server_pid: int, trees: int, children: int, commands: int, streams: int, log
                      ) -> dict:
    """2 workers on mail going both ways, routed by sender (the baseline) and by tree, alternately twice."""
    rows: dict[str, list[dict]] = {"by_sender": [], "by_tree": []}
    for _ in range(2):
        for route in rows:
            log(f"  both ways, routed {route.replace('_', ' ')}")
            rows[route].append(await run_one(url, False, [server_pid], 2, trees, children, commands, streams, log,
                                             both_ways=True, by_sender=route == "by_sender"))
    out = {route: {"rate": sum(r["rate"] for r in runs) / len(runs),
                   "worker_cpu_us": 1e6 * sum(r["worker_cpu_s"] for r in runs) / (commands * len(runs)),
                   "rates": [r["rate"] for r in runs], "outcomes": [r["outcomes"] for r in runs]}
           for route, runs in rows.items()}
    out["ratio"] = out["by_tree"]["rate"] / out["by_sender"]["rate"]
    log(f"  by tree / by sender: {out['ratio']:.2f}")
    return out


async def run_one(url: str, cluster: bool, server_pids: list[int], workers_count: int, trees: int, children: int,
                  commands: int, streams: int, log, both_ways: bool = False, by_sender: bool = False,
                  master_ports: list[int] | None = None) -> dict:
    """``master_ports``: the cluster's masters, read one by one around the drain (bench/masters.py)."""
    await flush(url, cluster)
    cfg = config(url, streams, cluster)
    t = time.perf_counter()
    host = await Treemail.connect(cfg, url)
    try:
        registered = await balanced_trees(host, trees, children, streams, children_send=both_ways,
                                          partitions=cfg.service.partitions)
    finally:
        await host.close()
    r = client(url, cluster)
    names = [keys.command_stream(i) for i in range(streams)]
    extra = {"TREEMAIL_SERVICE_COMMAND_STREAMS": str(streams),
             "TREEMAIL_SERVICE_CLUSTER": "true" if cluster else "false"}
    workers = Workers(url, extra)
    try:
        per_stream = await prefill_commands(r, registered, commands, streams, both_ways=both_ways,
                                            by_sender=by_sender)
        log(f"  {'cluster' if cluster else 'single'}: registered {trees * (children + 1)} sessions, prefilled "
            f"{commands} commands over {streams} streams {list(per_stream.values())} in "
            f"{time.perf_counter() - t:.1f} s; starting {workers_count} worker(s)")
        nodes = per_master.clients(master_ports or [])
        try:
            if nodes:
                probed = await per_master.probe_crossslot(nodes[0])
                held = [sum(1 for name in names if r.get_node_from_key(name).port == port) for port in master_ports]
                feeds = [keys.feed(p) for p in range(cfg.service.partitions)]
                partitions_held = [sum(1 for name in feeds if r.get_node_from_key(name).port == port)
                                   for port in master_ports]
            drain = await timed_drain(r, names, workers, workers_count, commands, server_pids,
                                      sample=(lambda: per_master.sample(nodes)) if nodes else None)
        finally:
            for node in nodes:
                await node.aclose()
    finally:
        workers.stop()
    try:
        outcomes = await count_replies(r, commands)
    finally:
        await r.aclose()
    rate = commands / drain["seconds"]
    log(f"  {'cluster' if cluster else 'single'}, {workers_count} worker(s): {commands} commands in "
        f"{drain['seconds']:.2f} s = {rate:,.0f} commands/s; outcomes {outcomes}; CPU: valkey {drain['valkey_cpu_s']:.1f} s, "
        f"workers {drain['worker_cpu_s']:.1f} s, other processes on the machine {drain['other_cpu_s']:.1f} s")
    if master_ports:
        drain["per_master"] = per_master.summary(*drain.pop("samples"), commands, held, partitions_held)
        drain["per_master"]["crossslot_probe"] = probed
        pm = drain["per_master"]
        shares = " / ".join(f"{m['share']:.2f}" for m in pm["masters"])
        log(f"  per master: CPU shares {shares}, Valkey "
            f"{pm['valkey_us_per_decision']:.1f} us per decision, command streams held "
            f"{' / '.join(str(m['streams_held']) for m in pm['masters'])}, partitions held "
            f"{' / '.join(str(m['partitions_held']) for m in pm['masters'])}; cross-slot "
            f"refusals {pm['crossslot']} (the probe's own: {probed}), errors {pm['errors']}")
    return {"workers": workers_count, **drain, "rate": rate, "outcomes": outcomes,
            "per_stream": list(per_stream.values())}
