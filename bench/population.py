"""Scale of state: 100,000 sessions on one Valkey; memory per session, and decision latency next to a fresh server's.

The population is registered through the host API (`Treemail.register_root` /
`register_child`: the directory entry, the partition's session set, the tree's
keys, SessionRegistered decided and committed), trees of 1 root + 9 children,
many trees in flight at once: one tree at a time in one process does about
850 sessions/s here, 16 trees in flight about twice that.

The baseline is a second, fresh Valkey started for this phase that holds only
the probe trees, registered the same way, with its own worker process. The
probes alternate between the two servers send by send (as phase `history`
alternates its two recipients), so both see the same moments of a machine
shared with other work. A "fresh session" on the populated server itself
would share its keyspace and memory with the 100,000, which is what is measured.
"""

import asyncio
import time

import redis.asyncio as aioredis

from treemail.adapters import keys
from treemail.adapters.embedded import LocalValkey
from treemail.host import SendContext, Treemail

from .common import Workers, bench_config, flush_sync, percentile
from .memory import usage_by_kind, used_memory

CHILDREN = 9  # per tree: 1 root + 9 children
IN_FLIGHT = 16  # trees registered at once
PROBE_TREES = 5  # on each server; their children send to their root


async def register_tree(host: Treemail, index: int) -> tuple[str, list[str]]:
    root = await host.register_root("planner", f"root {index}", rules={"child": "allow", "parent": "allow"},
                                    status="idle")
    kids = await asyncio.gather(*[
        host.register_child(root.session_id, "worker", f"child {index}.{c}", rules={"parent": "allow"}, status="idle")
        for c in range(CHILDREN)
    ])
    return root.session_id, [k.session_id for k in kids]


async def register_population(host: Treemail, trees: int) -> list[tuple[str, list[str]]]:
    out: list[tuple[str, list[str]] | None] = [None] * trees
    queue = iter(range(trees))

    async def lane() -> None:
        for index in queue:  # the lanes share one iterator: each tree is registered once
            out[index] = await register_tree(host, index)

    await asyncio.gather(*[lane() for _ in range(IN_FLIGHT)])
    return out


async def partition_sessions(r: aioredis.Redis, partitions: int) -> int:
    return sum([await r.scard(keys.partition_sessions(p)) for p in range(partitions)])


async def start_runs(host: Treemail, probes: list[tuple[str, list[str]]]) -> None:
    # Only a session's open run may send (exact live sender).
    await asyncio.gather(*[host.start_run(kid, "run-1") for _, kids in probes for kid in kids])


async def phase_sessions(url: str, sessions: int, probe_sends: int, log) -> dict:
    trees = sessions // (CHILDREN + 1)
    fresh_server = LocalValkey(durable=False)
    workers = Workers(url)
    fresh_workers = None
    host = fresh = None
    r = aioredis.Redis.from_url(url)
    try:
        await flush_sync(r)
        fresh_server.start()
        fresh_workers = Workers(fresh_server.url)
        host = await Treemail.connect(bench_config(url), url)
        fresh = await Treemail.connect(bench_config(fresh_server.url), fresh_server.url)
        partitions = bench_config(url).service.partitions
        before, keys_before = await used_memory(r), await r.dbsize()
        t = time.perf_counter()
        population = await register_population(host, trees)
        seconds = time.perf_counter() - t
        after, keys_after = await used_memory(r), await r.dbsize()
        registered = await partition_sessions(r, partitions)
        log(f"  registered {registered:,} sessions ({trees:,} trees of 1 + {CHILDREN}) in {seconds:.1f} s = "
            f"{registered / seconds:,.0f} sessions/s; used_memory +{(after - before) / 2**20:,.0f} MiB = "
            f"{(after - before) / registered:,.0f} bytes per session")
        # Probe trees spread over the population, and the same number registered on the fresh server.
        step = max(1, trees // PROBE_TREES)
        big_probes = [population[i * step + step // 2] for i in range(PROBE_TREES)]
        fresh_r = aioredis.Redis.from_url(fresh_server.url)
        try:
            fresh_probes = [await register_tree(fresh, i) for i in range(PROBE_TREES)]
            by_kind = await usage_by_kind(fresh_r, set())  # MEMORY USAGE of every key, before any mail
            fresh_sessions = await partition_sessions(fresh_r, partitions)
        finally:
            await fresh_r.aclose()
        per_kind = {kind_of_session(k): round(v / fresh_sessions) for k, v in
                    sorted(by_kind.items(), key=lambda kv: -kv[1]) if v / fresh_sessions >= 1}
        await start_runs(host, big_probes)
        await start_runs(fresh, fresh_probes)
        workers.start(1)
        fresh_workers.start(1)
        sides = {"populated": (host, big_probes), "fresh": (fresh, fresh_probes)}

        async def send(side: str, i: int, tag: str) -> float:
            who, probes = sides[side]
            root, kids = probes[i % PROBE_TREES]
            sender = kids[(i // PROBE_TREES) % CHILDREN]
            start = time.perf_counter()
            result = await who.send_message(SendContext(sender, "run-1", f"{tag}{i}"),
                                             {"to": root, "body": f"probe {i}"})
            if "message_id" not in result:
                raise RuntimeError(f"{side} send failed: {result}")
            return time.perf_counter() - start

        for i in range(PROBE_TREES * CHILDREN):  # warm up: every pair once (its producer is registered here)
            for side in sides:
                await asyncio.wait_for(send(side, i, "w"), 30)
        timings: dict[str, list[float]] = {side: [] for side in sides}
        for i in range(probe_sends):
            for side in (("populated", "fresh") if i % 2 else ("fresh", "populated")):
                timings[side].append(await send(side, i, "p"))
        workers.check_alive()
        fresh_workers.check_alive()
        final_memory = await used_memory(r)
    finally:
        for h in (host, fresh):
            if h is not None:
                await h.close()
        workers.stop()
        if fresh_workers is not None:
            fresh_workers.stop()
        fresh_server.cleanup()
        await r.aclose()
    big, small = timings["populated"], timings["fresh"]
    out = {
        "sessions": registered, "trees": trees, "register_seconds": seconds, "register_rate": registered / seconds,
        "bytes_per_session": (after - before) / registered, "keys_per_session": (keys_after - keys_before) / registered,
        "used_memory_after_registration": after, "used_memory_after_probes": final_memory,
        "fresh_sessions": fresh_sessions, "fresh_key_bytes_per_session_by_kind": per_kind,
        "probe_sends": probe_sends,
        "populated_p50_ms": percentile(big, 50) * 1000, "populated_p99_ms": percentile(big, 99) * 1000,
        "fresh_p50_ms": percentile(small, 50) * 1000, "fresh_p99_ms": percentile(small, 99) * 1000,
    }
    out["ratio_p50"] = out["populated_p50_ms"] / out["fresh_p50_ms"]
    log(f"  {registered:,}-session server: p50 {out['populated_p50_ms']:.2f} ms p99 {out['populated_p99_ms']:.2f} ms; "
        f"fresh server ({fresh_sessions} sessions): p50 {out['fresh_p50_ms']:.2f} ms p99 {out['fresh_p99_ms']:.2f} ms; "
        f"ratio p50 {out['ratio_p50']:.2f}; keys per session {out['keys_per_session']:.2f}; bytes per session "
        f"by kind of key (fresh server, MEMORY USAGE) {per_kind}")
    return out


def kind_of_session(kind: str) -> str:
    return kind.removeprefix("recipient ")
