"""`make bench`: one Valkey, one run, treemail next to a raw Redis baseline.

    python -m bench.run            # full run (about 9 min on 2 cores)
    python -m bench.run --quick    # smoke run (or BENCH_QUICK=1)
    python -m bench.run --only replay,scale_cluster   # some phases, print only (for profiling)

Phases (the Valkey is flushed between the throughput phases):
  1. one `treemail worker` process deciding a prefilled backlog of SendMessage commands
  2. the raw baseline: XREADGROUP + pipelined HMGET + Lua CAS XADD + XACK, same backlog shape
  2b. the records' floor: the raw loop plus the records treemail keeps per send and its answer, deciding nothing
  3. two worker processes on the same backlog
  3b-3d. the durable profile; memory per accepted message vs a bare XADD; what is left after 1,000,000 sends
  3e. the replicated profile: phase 1 on a Valkey with one replica, WAIT before every answer
  4. host round-trip latency at a steady send rate, one worker running: at half of phase 1's rate, and at
     the fixed 2,000/s where that is below it
     (each rate also through a bare XADD + BLMPOP round trip to an echo consumer: host CPU per send)
  4d. subtree broadcast: from the call until each of 100 descendants' copies is claimable, two workers
  4g. the first decision after a 0.3 s server outage (kill -9 and restart), next to a healthy round trip
  5. send latency to a recipient whose stream holds ~1M events vs a fresh one
  5b. 100,000 sessions registered on the Valkey: memory per session, send latency vs a fresh server's
  6. replay rate: projections.replay.rebuild(write=False, and write=True) vs raw XRANGE + json.loads, ~500k events
  7. scale-out: 1, 2, 4 worker processes, 4 command streams, on the same Valkey
  8. the same on a local 3-master Valkey Cluster started for this phase
  9. the MCP path: sends over streamable HTTP from 8 clients, next to an empty tool on the same server and
     the host API (bench/mcp.py)
  10. loop detection on a fan-out/fan-in tree (bench/fanout_loops.py)
  11. the web page's history cache with 16 KB bodies: its byte budget, estimated and measured (bench/historycache.py)
  12. the TypeScript host over `treemail gateway` next to the Python host: send round trip and claim
     latency, one at a time, alternating rounds (bench/gateway.py)

Over the house's 200 lines: one function per phase, run in order by ``main``,
so a reader of BENCHMARKS.md finds every figure's measurement in one file
(the larger phases in modules of their own; the table's wording in ``report``).
"""

import argparse
import asyncio
import json
import os
import random
import sys
import time

import redis.asyncio as aioredis

from treemail.adapters import keys
from treemail.adapters.embedded import LocalValkey
from treemail.host import SendContext, Treemail
from treemail.domain import events as ev
from treemail.domain.state import evolve

from . import (agent_mail, backpressure, decision, fanout, fanout_loops, floor, gateway, historycache, latency, mcp, mcp_conversation, memory, million, population, priority, raw,
               recovery, replay, scale, wakes)
from .report import ROOT, report, write_markdown
from .sizes import FULL, QUICK, Sizes
from .common import (Server, open_server, server_of, busy_seconds, cpu_seconds, Workers, bench_config, flush, machine, percentile, prefill_commands, count_replies,
                     register_trees, timed_drain)

VALKEY_PID = 0  # set in main: its CPU time is read around each throughput phase


SCALE_WORKERS = (1, 2, 4)
HISTORY_SENDERS = 5  # children per recipient in phase 5; each sends at most (50 + probe_sends) / 5


def log(message: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {message}", flush=True)


async def setup_backlog(url: str, sizes: Sizes, streams: int = 1) -> dict[str, int]:
    """Returns how many commands went to each command stream."""
    host = await Treemail.connect(bench_config(url), url)
    try:
        trees = await register_trees(host, sizes.trees, sizes.children)
        async with server_of(url) as server:
            return await prefill_commands(server.redis, trees, sizes.commands, streams)
    finally:
        await host.close()


async def check_replies(url: str, total: int) -> dict[str, int]:
    r = aioredis.Redis.from_url(url)
    try:
        return await count_replies(r, total)
    finally:
        await r.aclose()


async def phase_workers(url: str, sizes: Sizes, count: int, extra_env: dict[str, str] | None = None,
                        server_pid: int | None = None, streams: int = 1) -> dict:
    """``streams``: the command streams the backlog is spread over (each tree's on one, as producers route
    them); each is read by one worker at a time (``exclusive_streams``)."""
    server_pid = server_pid or VALKEY_PID
    await flush(url)
    t = time.perf_counter()
    per_stream = await setup_backlog(url, sizes, streams)
    log(f"  registered {sizes.trees * (sizes.children + 1)} sessions, prefilled {sizes.commands} commands "
        f"{list(per_stream.values())} in {time.perf_counter() - t:.1f} s; starting {count} worker process(es)")
    workers = Workers(url, {"TREEMAIL_SERVICE_COMMAND_STREAMS": str(streams), **(extra_env or {})})
    r = aioredis.Redis.from_url(url)
    try:
        drain = await timed_drain(r, list(per_stream), workers, count, sizes.commands, [server_pid])
    finally:
        workers.stop()
        await r.aclose()
    outcomes = await check_replies(url, sizes.commands)
    rate = sizes.commands / drain["seconds"]
    log(f"  {count} worker(s): {sizes.commands} commands in {drain['seconds']:.2f} s = {rate:,.0f} commands/s; "
        f"outcomes {outcomes}; CPU: valkey {drain['valkey_cpu_s']:.1f} s, worker(s) {drain['worker_cpu_s']:.1f} s")
    return {**drain, "rate": rate, "outcomes": outcomes, "per_stream": list(per_stream.values())}


async def phase_raw(url: str, sizes: Sizes) -> dict:
    await flush(url)
    recipients = [f"r{i}" for i in range(sizes.trees * sizes.children)]
    rng = random.Random(42)
    order = [rng.randrange(len(recipients)) for _ in range(sizes.commands)]
    r = aioredis.Redis.from_url(url)
    try:
        await raw.prefill(r, recipients, sizes.commands, order)
    finally:
        await r.aclose()
    return await timed_in_process("raw", raw.run_worker, url, sizes.commands)


async def timed_in_process(name: str, run_worker, url: str, commands: int) -> dict:
    """A baseline loop run in the benchmark process: its rate, and the CPU of Valkey and of this process
    (the loop's) over it."""
    valkey_cpu, own_cpu = cpu_seconds(VALKEY_PID), time.process_time()
    seconds, decided = await run_worker(url, commands)
    valkey_cpu, own_cpu = cpu_seconds(VALKEY_PID) - valkey_cpu, time.process_time() - own_cpu
    rate = decided / seconds
    log(f"  {name}: {decided} commands in {seconds:.2f} s = {rate:,.0f} commands/s; CPU: valkey {valkey_cpu:.1f} s, "
        f"worker {own_cpu:.1f} s")
    return {"seconds": seconds, "rate": rate, "valkey_cpu_s": valkey_cpu, "worker_cpu_s": own_cpu}


async def phase_floor(url: str, sizes: Sizes) -> dict:
    """The raw loop plus the records treemail keeps per send (bench/floor.py): throughput and CPU on the
    raw phase's backlog shape, then memory per 200-byte message next to a bare XADD."""
    await flush(url)
    rng = random.Random(42)
    pairs = floor.pairs_of(floor.trees_of(sizes.trees, sizes.children))
    r = aioredis.Redis.from_url(url)
    try:
        await floor.prefill(r, [(*pairs[rng.randrange(len(pairs))], f"benchmark message {i}")
                                for i in range(sizes.commands)])
    finally:
        await r.aclose()
    out = await timed_in_process("floor", floor.run_worker, url, sizes.commands)
    await flush(url)
    mem = await floor.phase_memory(url, sizes.memory_sends, memory.BODY, log)
    r = aioredis.Redis.from_url(url)
    try:
        mem["bare_xadd_bytes"] = await memory.bare_xadd(r, sizes.memory_sends)
    finally:
        await r.aclose()
    return {**out, "memory": mem}


async def phase_round_trip(url: str, sizes: Sizes, results: dict) -> dict:
    """The send round trip at half of one worker's capacity measured in this run (``latency.paced_rate``)."""
    rate, basis = latency.paced_rate(results.get("one"), sizes.latency_rate)
    return await latency.phase_latency(url, rate, sizes.latency_seconds, sizes.latency_rounds, log, basis)


async def phase_fixed_round_trip(url: str, sizes: Sizes, results: dict) -> dict:
    """The round trip at the fixed rate earlier runs were read at, where it is below the paced phase's rate
    (at or above it, the worker would run at or past half its capacity: the queue, not the path)."""
    paced = results.get("latency", {}).get("target_rate") or latency.paced_rate(results.get("one"),
                                                                                  sizes.latency_rate)[0]
    if sizes.latency_rate >= paced:
        log(f"  skipped: {sizes.latency_rate:,}/s is not below the paced rate {paced:,}/s")
        return {"skipped": f"{sizes.latency_rate:,}/s is not below half the capacity ({paced:,}/s)",
                "target_rate": sizes.latency_rate}
    return await latency.phase_latency(url, sizes.latency_rate, sizes.latency_seconds, sizes.latency_rounds, log,
                                       "the fixed rate of earlier runs")


async def timed_send(host: Treemail, ctx: SendContext, to: str, body: str) -> tuple[float, dict]:
    start = time.perf_counter()
    result = await host.send_message(ctx, {"to": to, "body": body})
    return time.perf_counter() - start, result


FILL_LUA = """
local n = tonumber(ARGV[1])
for _ = 1, tonumber(ARGV[2]) do
  local mid = ARGV[7] .. n
  redis.call('XADD', KEYS[1], n .. '-0', 'type', 'ProducerMessageAccepted', 'data', ARGV[3] .. mid .. ARGV[4])
  redis.call('XADD', KEYS[1], (n + 1) .. '-0', 'type', 'ProducerMessageConsumed', 'data', ARGV[5] .. mid .. ARGV[6])
  n = n + 2
end
return n - 1
"""


async def fill_history(server: Server, sender_id: str, recipient_id: str, events: int) -> int:
    """Give the recipient a stream of ~`events` events as if that much mail had come and gone.

    Version 2 is the sender's ProducerRegistered, then (Accepted, Consumed) pairs
    with entry ids "<n>-0". The snapshot is the real fold (evolve) of these
    events: every pair leaves the state unchanged, so folding one pair is the
    fold of all of them. No mail is pending, so the pending-mail hash stays empty.
    """
    record = await server.sessions.record(recipient_id)
    sender = await server.sessions.record(sender_id)
    stream = keys.session_stream(record.partition, record.session_id)
    loaded = await server.store.load(record)
    first = loaded.version + 1
    producer = f"agent:{sender_id}"
    registered = ev.ProducerRegistered(at=time.time(), producer_id=producer, owner="agent", sender_session_id=sender_id)
    accepted = ev.ProducerMessageAccepted(
        at=time.time(), message_id="__MID__", producer_id=producer, owner="agent", sender_session_id=sender_id,
        sender_handle=sender.handle, body="an old message " * 8, mode="steer", agent_hop=0, run_id="run-old",
        tool_call_id="call-old",
    )
    consumed = ev.ProducerMessageConsumed(at=time.time(), message_id="__MID__", owner="agent",
                                          sender_session_id=sender_id, agent_hop=0, run_id=None)
    state = loaded.state
    for event in (registered, accepted, consumed):
        state = evolve(state, event)
    await server.redis.xadd(stream, dict(zip(("type", "data"), ev.encode(registered))), id=f"{first}-0")
    acc_pre, acc_post = ev.encode(accepted)[1].split("__MID__")
    con_pre, con_post = ev.encode(consumed)[1].split("__MID__")
    script = server.redis.register_script(FILL_LUA)
    pairs = max(1, (events - 2) // 2)
    n, step = first + 1, 50_000
    last = first
    for start in range(0, pairs, step):
        count = min(step, pairs - start)
        last = int(await script(keys=[stream], args=[n, count, acc_pre, acc_post, con_pre, con_post, "old-"]))
        n = last + 1
    await server.redis.hset(keys.session_snapshot(record.partition, record.session_id),
                          mapping={"version": last, "snapshot": state.to_json()})
    return last


async def phase_history(url: str, sizes: Sizes) -> dict:
    await flush(url)
    workers = Workers(url)
    host = await Treemail.connect(bench_config(url), url)
    server = await open_server(url)
    try:
        # The two recipients are roots; their children send to them ("parent"), taking turns, so no
        # sender reaches the per-source capacity (nobody consumes).
        (big, big_kids), (fresh, fresh_kids) = await register_trees(host, 2, HISTORY_SENDERS, run_on="children")
        senders = {big: big_kids, fresh: fresh_kids}
        t = time.perf_counter()
        last = await fill_history(server, big_kids[0], big, sizes.big_events)
        length = await server.redis.xlen(keys.session_stream((await server.sessions.record(big)).partition, big))
        info = await server.redis.info("memory")
        log(f"  filled the big recipient's stream: {length:,} events (version {last:,}) in "
            f"{time.perf_counter() - t:.1f} s; Valkey used_memory {info['used_memory_human']}")
        workers.start(1)
        for i in range(50):  # warm up both recipients (the fresh one registers its producer here)
            for to in (big, fresh):
                sender = senders[to][i % HISTORY_SENDERS]
                _, result = await timed_send(host, SendContext(sender, "run-1", f"w{i}-{to}"), to, "warm up")
                if "message_id" not in result:
                    raise RuntimeError(f"warm-up send failed: {result}")
        timings = {big: [], fresh: []}
        for i in range(sizes.probe_sends):
            for to in ((big, fresh) if i % 2 else (fresh, big)):
                sender = senders[to][i % HISTORY_SENDERS]
                seconds, result = await timed_send(host, SendContext(sender, "run-1", f"p{i}-{to}"), to,
                                                   f"probe {i}")
                if "message_id" not in result:
                    raise RuntimeError(f"probe send failed: {result}")
                timings[to].append(seconds)
        workers.check_alive()
        big_record = await server.sessions.record(big)
        version_after = int(await server.redis.hget(keys.session_snapshot(big_record.partition, big), "version"))
    finally:
        await server.close()
        await host.close()
        workers.stop()
    out = {
        "events": length, "version_after": version_after,
        "big_p50_ms": percentile(timings[big], 50) * 1000, "big_p99_ms": percentile(timings[big], 99) * 1000,
        "fresh_p50_ms": percentile(timings[fresh], 50) * 1000,
        "fresh_p99_ms": percentile(timings[fresh], 99) * 1000,
    }
    out["ratio_p50"] = out["big_p50_ms"] / out["fresh_p50_ms"]
    log(f"  1M-event recipient: p50 {out['big_p50_ms']:.2f} ms p99 {out['big_p99_ms']:.2f} ms; fresh: p50 "
        f"{out['fresh_p50_ms']:.2f} ms p99 {out['fresh_p99_ms']:.2f} ms; ratio p50 {out['ratio_p50']:.2f}")
    return out


async def phase_replay(url: str, sizes: Sizes) -> dict:
    await flush(url)
    t = time.perf_counter()
    sessions, written = await replay.fill(url, sizes.replay_trees, sizes.replay_children, sizes.replay_events,
                                          fill_history)
    r = aioredis.Redis.from_url(url)
    try:
        info = await r.info("memory")
    finally:
        await r.aclose()
    log(f"  filled {sessions} session streams, {written:,} events in {time.perf_counter() - t:.1f} s; "
        f"Valkey used_memory {info['used_memory_human']}")
    partitions = list(range(bench_config(url).service.partitions))
    raws, replays, writes = [], [], []
    busy, own = busy_seconds(), time.process_time()
    for attempt in range(2):  # alternate, best of two each: the machine is shared
        seconds, events = await replay.raw_loop(url, partitions)
        raws.append((seconds, events))
        log(f"  raw XRANGE + json.loads: {events:,} events in {seconds:.2f} s = {events / seconds:,.0f} events/s")
        seconds, events, views = await replay.replay(url, partitions)
        replays.append((seconds, events))
        log(f"  rebuild(write=False): {events:,} events in {seconds:.2f} s = {events / seconds:,.0f} events/s")
        seconds, events, written_views = await replay.replay(url, partitions, write=True)
        writes.append((seconds, events))
        log(f"  rebuild(write=True): {events:,} events in {seconds:.2f} s = {events / seconds:,.0f} events/s")
    other = max(0.0, busy_seconds() - busy - (time.process_time() - own))  # includes Valkey serving XRANGE
    check = replay.check_views(views, sessions, written)
    if {k: dict(v) for k, v in written_views.items()} != {k: dict(v) for k, v in views.items()}:
        raise RuntimeError("rebuild(write=True) folded other views than rebuild(write=False)")
    raw_s, raw_n = min(raws)
    rep_s, rep_n = min(replays)
    wri_s, wri_n = min(writes)
    out = {"sessions": sessions, "events": rep_n, "raw_events": raw_n, "raw_seconds": raw_s, "raw_rate": raw_n / raw_s,
           "replay_seconds": rep_s, "replay_rate": rep_n / rep_s, "all_raw_seconds": [x[0] for x in raws],
           "all_replay_seconds": [x[0] for x in replays], "write_events": wri_n, "write_seconds": wri_s,
           "write_rate": wri_n / wri_s, "all_write_seconds": [x[0] for x in writes], "views_check": check,
           "other_cpu_s_incl_valkey": other}
    out["ratio"] = out["replay_rate"] / out["raw_rate"]
    out["write_ratio"] = out["write_rate"] / out["raw_rate"]
    timed = sum(out["all_raw_seconds"]) + sum(out["all_replay_seconds"]) + sum(out["all_write_seconds"])
    log(f"  replay/raw {out['ratio']:.2f}, with writing {out['write_ratio']:.2f}; views {check}; CPU of Valkey "
        f"and other processes over the {timed:.1f} s: {other:.1f} s")
    return out


async def phase_scale(url: str, sizes: Sizes, cluster: bool, server_pids: list[int],
                      master_ports: list[int] | None = None) -> list[dict]:
    rows = []
    for count in SCALE_WORKERS:
        rows.append(await scale.run_one(url, cluster, server_pids, count, sizes.scale_trees, sizes.scale_children,
                                        sizes.scale_commands, sizes.scale_streams, log, master_ports=master_ports))
    return rows


def run_cluster_phase(sizes: Sizes, planned: bool = True) -> list[dict]:
    """On a local 3-master cluster whose slots follow the slot plan (``planned``; else an even split), so each
    master holds an even share of the partitions and of the command streams, as `treemail cluster-plan`
    tells an operator to place them."""
    from treemail.adapters import slotplan
    from treemail.adapters.config import ServiceConfig
    from treemail.adapters.embedded import LocalValkeyCluster

    plan = slotplan.plan(3, ServiceConfig().partitions, sizes.scale_streams) if planned else None
    cluster = LocalValkeyCluster(masters=3, plan=plan)
    try:
        cluster.start()
        pids = [node.pid for node in cluster.nodes]
        log(f"  local cluster of {len(pids)} masters at {cluster.url}, slots "
            + ("as the slot plan places them: partitions " + " / ".join(str(len(m.partitions)) for m in plan.masters)
               + ", command streams " + " / ".join(str(len(m.streams)) for m in plan.masters)
               if plan else "split evenly"))
        return asyncio.run(phase_scale(cluster.url, sizes, True, pids, [node.port for node in cluster.nodes]))
    finally:
        cluster.cleanup()


def run_durable_phase(sizes: Sizes) -> dict:
    """Phase 1 again on a Valkey with AOF, workers in the durable profile (WAITAOF before success)."""
    server = LocalValkey(durable=True)
    try:
        server.start()
        return asyncio.run(phase_workers(server.url, sizes, 1, {"TREEMAIL_SERVICE_PROFILE": "durable"},
                                         server.pid))
    finally:
        server.cleanup()


def run_replicated_phase(sizes: Sizes) -> dict:
    """Phase 1 again on a Valkey with one replica, workers in the replicated profile (WAIT before success)."""
    from treemail.adapters.replication import online_replicas

    primary = LocalValkey()
    replica = None
    try:
        primary.start()
        replica = LocalValkey(config={"replicaof": f"127.0.0.1 {primary.port}"}).start()
        deadline = time.monotonic() + 30
        while online_replicas(asyncio.run(_replication(primary.url))) < 1:
            if time.monotonic() > deadline:
                raise RuntimeError("the replica never came in sync")
            time.sleep(0.1)
        return asyncio.run(phase_workers(primary.url, sizes, 1, {"TREEMAIL_SERVICE_PROFILE": "replicated"},
                                         primary.pid))
    finally:
        if replica is not None:
            replica.cleanup()
        primary.cleanup()


async def _replication(url: str) -> dict:
    r = aioredis.Redis.from_url(url)
    try:
        return await r.info("replication")
    finally:
        await r.aclose()


async def valkey_version(url: str) -> str:
    r = aioredis.Redis.from_url(url)
    try:
        info = await r.info("server")
        return f"valkey {info.get('valkey_version') or info.get('redis_version')}"
    finally:
        await r.aclose()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="bench.run")
    parser.add_argument("--quick", action="store_true", help="shrink every phase for a smoke run")
    parser.add_argument("--no-write", action="store_true", help="print only, leave BENCHMARKS.md alone")
    parser.add_argument("--only", default="", help="comma-separated phases (one,decision,raw,floor,durable,replicated,memory,two,latency,latency_fixed,latency_low,wake_latency,fanout,backpressure,recovery,"
                        "priority,history,sessions,replay,scale_single,routing,scale_cluster,mcp,mcp_conversation,agent_mail,fanout_loops,history_cache,gateway); implies --no-write")
    args = parser.parse_args(argv)
    only = [p for p in args.only.split(",") if p]
    quick = args.quick or os.environ.get("BENCH_QUICK", "") not in ("", "0")
    sizes = QUICK if quick else FULL
    started = time.perf_counter()
    server = LocalValkey(durable=False)
    try:
        server.start()
        global VALKEY_PID
        VALKEY_PID = server.pid
        url = server.url
        env = machine()
        env["valkey"] = asyncio.run(valkey_version(url))
        log(f"Valkey at {url}; {env['cpu']}, {env['cores']} cores, Python {env['python']}, {env['valkey']}")
        results = {}
        phases = [
            ("one", "phase 1: one treemail worker process", lambda: asyncio.run(phase_workers(url, sizes, 1))),
            ("decision", "phase 1b: one worker's CPU per decision without its I/O, stage by stage",
             lambda: asyncio.run(decision.phase_decision(url, sizes.trees, sizes.children,
                                                                 sizes.decision_commands, log))),
            ("raw", "phase 2: raw Redis baseline", lambda: asyncio.run(phase_raw(url, sizes))),
            ("floor", "phase 2b: the records' floor: the raw loop plus the records treemail keeps per send",
             lambda: asyncio.run(phase_floor(url, sizes))),
            ("durable", "phase 3b: one worker, durable profile (AOF + WAITAOF), on its own Valkey",
             lambda: run_durable_phase(sizes)),
            ("replicated", "phase 3e: one worker, replicated profile (WAIT for 1 replica), on its own Valkey and replica",
             lambda: run_replicated_phase(sizes)),
            ("memory", "phase 3c: memory per accepted message vs a bare XADD",
             lambda: asyncio.run(memory.phase_memory(url, sizes.memory_sends, log))),
            ("million", f"phase 3d: {sizes.million_sends:,} sends through one worker: what is left",
             lambda: asyncio.run(million.phase_million(url, sizes.million_sends, log))),
            ("two", "phase 3: two treemail worker processes, the backlog over two command streams",
             lambda: asyncio.run(phase_workers(url, sizes, 2, streams=2))),
            ("latency", "phase 4: producer round-trip latency at half of one worker's capacity in this run",
             lambda: asyncio.run(phase_round_trip(url, sizes, results))),
            ("latency_fixed", f"phase 4a: the same at a fixed {sizes.latency_rate:,}/s, where that is below half "
                              "the capacity",
             lambda: asyncio.run(phase_fixed_round_trip(url, sizes, results))),
            ("latency_low", "phase 4b: the same at a quarter of the rate",
             lambda: asyncio.run(latency.phase_latency(url, sizes.latency_rate // 4, sizes.latency_seconds,
                                                       sizes.latency_rounds, log))),
            ("wake_latency", "phase 4c: wake latency, commit to trigger",
             lambda: asyncio.run(wakes.phase_wake_latency(url, sizes.wake_sends, log))),
            ("fanout", "phase 4d: subtree broadcast fan-out to 100 descendants, call to each copy claimable",
             lambda: asyncio.run(fanout.phase_fanout(url, sizes.fanout_rounds, log))),
            ("backpressure", "phase 4e: typed backpressure, a steady producer faster than its consumer honouring "
                             "retry_after_ms (the controllable clock)",
             lambda: asyncio.run(backpressure.phase_backpressure(url, 20.0 if quick else 120.0, log))),
            ("priority", f"phase 4f: an urgent steer behind {priority.CHATTER} queued messages, next to a normal one",
             lambda: asyncio.run(priority.phase_priority(url, sizes.priority_trials, log))),
            ("recovery", f"phase 4g: the first decision after a {recovery.OUTAGE_S} s server outage, on its own "
                         "durable Valkey", lambda: asyncio.run(recovery.phase_recovery(sizes.recovery_rounds, log))),
            ("history", "phase 5: decision latency on a long stream", lambda: asyncio.run(phase_history(url, sizes))),
            ("sessions", f"phase 5b: {sizes.sessions:,} sessions on one Valkey: memory per session, decision latency "
                         "vs a fresh server", lambda: asyncio.run(population.phase_sessions(url, sizes.sessions,
                                                                                           sizes.probe_sends, log))),
            ("replay", "phase 6: projection replay rate vs raw XRANGE + json.loads",
             lambda: asyncio.run(phase_replay(url, sizes))),
            ("scale_single", f"phase 7: scale-out, {SCALE_WORKERS} worker processes, one Valkey, "
                             f"{sizes.scale_streams} command streams",
             lambda: asyncio.run(phase_scale(url, sizes, False, [VALKEY_PID]))),
            ("routing", f"phase 7b: 2 worker processes, mail both ways in each tree, routed by tree and by sender, "
                        f"one Valkey, {sizes.scale_streams} command streams",
             lambda: asyncio.run(scale.run_routing(url, VALKEY_PID, sizes.scale_trees, sizes.scale_children,
                                                   sizes.scale_commands, sizes.scale_streams, log))),
            ("scale_cluster", f"phase 8: scale-out, {SCALE_WORKERS} worker processes, local 3-master Valkey Cluster, "
                              f"{sizes.scale_streams} command streams",
             lambda: run_cluster_phase(sizes)),
            ("mcp", f"phase 9: MCP over streamable HTTP, {mcp.CLIENTS} clients: send_message next to an empty tool "
                    "and the host API",
             lambda: asyncio.run(mcp.phase_mcp(url, sizes.mcp_seconds, sizes.mcp_rounds, log, VALKEY_PID))),
            ("mcp_conversation", "phase 9b: two agents converse over streamable HTTP, receiving with leases, "
                                 f"with {' and '.join(map(str, mcp_conversation.PAIRS))} pairs",
             lambda: asyncio.run(mcp_conversation.phase_mcp_conversation(url, sizes.mcp_conversation_seconds, log))),
            ("agent_mail", "phase 9c: the conversation side by side, treemail and mcp-agent-mail through the same MCP "
                           f"client, with {' and '.join(map(str, mcp_conversation.PAIRS))} pairs",
             lambda: asyncio.run(agent_mail.phase_agent_mail(url, sizes.mcp_conversation_seconds, log))),
            ("fanout_loops", f"phase 10: loop detection, {fanout_loops.CHILDREN} children reporting to a parent and "
                             "answered, then a ping-pong",
             lambda: asyncio.run(fanout_loops.phase_fanout_loops(url, sizes.loop_rounds, log))),
            ("history_cache", f"phase 11: the web page's history cache, {sizes.cache_sessions} sessions of "
                              f"{historycache.BODY_BYTES // 1024} KB messages, a {sizes.cache_budget_mib} MiB budget",
             lambda: asyncio.run(historycache.phase_history_cache(url, sizes.cache_sessions, sizes.cache_messages,
                                                                  sizes.cache_budget_mib * 2**20, log))),
            ("gateway", "phase 12: the TypeScript host over `treemail gateway` next to the Python host: send round trip "
                        "and claim, one at a time",
             lambda: asyncio.run(gateway.phase_gateway(url, sizes.gateway_sends, sizes.gateway_rounds, log))),
        ]
        for key, label, run in phases:
            if only and key not in only:
                continue
            log(label)
            results[key] = run()
    finally:
        server.cleanup()
    wall = time.perf_counter() - started
    if only:
        print(json.dumps(results, indent=1, default=str))
        return 0
    table = report(results, env, sizes, quick, wall)
    print()
    print(table)
    if not args.no_write:
        write_markdown(table, results, env, sizes, quick)
        print(f"\nwrote {ROOT / 'BENCHMARKS.md'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
