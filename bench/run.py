"""`make bench`: one Valkey, one run, treemail next to a raw Redis baseline.

    python -m bench.run            # full run (about 9 min on 2 cores)
    python -m bench.run --quick    # smoke run (or BENCH_QUICK=1)
    python -m bench.run --only replay,scale_cluster   # some phases, print only (for profiling)

Phases (the Valkey is flushed between the throughput phases):
  1. one `treemail worker` process deciding a prefilled backlog of SendMessage commands
  2. the raw baseline: XREADGROUP + pipelined HMGET + Lua CAS XADD + XACK, same backlog shape
  3. two worker processes on the same backlog
  3b-3d. the durable profile; memory per accepted message vs a bare XADD; what is left after 1,000,000 sends
  4. host round-trip latency at a steady send rate, one worker running
     (each rate also through a bare XADD + BLMPOP round trip to an echo consumer: host CPU per send)
  5. send latency to a recipient whose stream holds ~1M events vs a fresh one
  5b. 100,000 sessions registered on the Valkey: memory per session, send latency vs a fresh server's
  6. replay rate: projections.replay.rebuild(write=False, and write=True) vs raw XRANGE + json.loads, ~500k events
  7. scale-out: 1, 2, 4 worker processes, 4 command streams, on the same Valkey
  8. the same on a local 3-master Valkey Cluster started for this phase

Over the house's 200 lines: one function per phase, run in order by ``main``,
so a reader of BENCHMARKS.md finds every figure's measurement in one file.
"""

import argparse
import asyncio
import json
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import redis.asyncio as aioredis

from treemail.adapters import keys
from treemail.adapters.embedded import LocalValkey
from treemail.host import SendContext, Treemail
from treemail.domain import events as ev
from treemail.domain.state import evolve

from . import latency, memory, million, population, raw, replay, scale
from .common import (busy_seconds, cpu_seconds, STREAM, Workers, bench_config, flush, machine, percentile, prefill_commands, count_replies,
                     register_trees, wait_drained)

ROOT = Path(__file__).resolve().parent.parent
VALKEY_PID = 0  # set in main: its CPU time is read around each throughput phase


@dataclass
class Sizes:
    trees: int
    children: int
    commands: int
    latency_rate: int
    latency_seconds: float
    latency_rounds: int  # at each rate; the percentiles are over every round's sends (bench/latency.py)
    big_events: int
    probe_sends: int
    replay_trees: int = 20  # x (1 root + replay_children) sessions
    replay_children: int = 9
    replay_events: int = 2500  # per session
    scale_trees: int = 80
    scale_children: int = 10
    scale_commands: int = 60_000
    scale_streams: int = 4
    memory_sends: int = 10_000
    million_sends: int = 1_000_000  # phase 3d: what is left after them
    sessions: int = 100_000  # phase 5b: registered on one Valkey


FULL = Sizes(trees=200, children=5, commands=100_000, latency_rate=2000, latency_seconds=5.0, latency_rounds=3,
             big_events=1_000_000, probe_sends=1000)
QUICK = Sizes(trees=20, children=5, commands=5_000, latency_rate=500, latency_seconds=1.0, latency_rounds=1,
              big_events=20_000, probe_sends=100, replay_trees=4, replay_children=4, replay_events=2000,
              scale_trees=8, scale_children=20, scale_commands=3_000, memory_sends=1_000,
              million_sends=20_000, sessions=2_000)
SCALE_WORKERS = (1, 2, 4)
HISTORY_SENDERS = 5  # children per recipient in phase 5; each sends at most (50 + probe_sends) / 5


def log(message: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {message}", flush=True)


async def setup_backlog(url: str, sizes: Sizes) -> None:
    host = await Treemail.connect(bench_config(url), url)
    try:
        trees = await register_trees(host, sizes.trees, sizes.children)
        await prefill_commands(host.redis, trees, sizes.commands)
    finally:
        await host.close()


async def check_replies(url: str, total: int) -> dict[str, int]:
    r = aioredis.Redis.from_url(url)
    try:
        return await count_replies(r, total)
    finally:
        await r.aclose()


async def phase_workers(url: str, sizes: Sizes, count: int, extra_env: dict[str, str] | None = None,
                        server_pid: int | None = None) -> dict:
    server_pid = server_pid or VALKEY_PID
    await flush(url)
    t = time.perf_counter()
    await setup_backlog(url, sizes)
    log(f"  registered {sizes.trees * (sizes.children + 1)} sessions, prefilled {sizes.commands} commands "
        f"in {time.perf_counter() - t:.1f} s; starting {count} worker process(es)")
    workers = Workers(url, extra_env)
    r = aioredis.Redis.from_url(url)
    try:
        # Hold the backlog back (group cursor at the end) until every worker has started and
        # joined the group, then rewind the cursor: start-up is not timed, all workers start together.
        await r.xgroup_setid(STREAM, keys.COMMAND_GROUP, "$")
        workers.start(count)
        deadline = time.perf_counter() + 60
        while len(await r.xinfo_consumers(STREAM, keys.COMMAND_GROUP)) < count:
            workers.check_alive()
            if time.perf_counter() > deadline:
                raise TimeoutError("workers did not join the consumer group within 60 s")
            await asyncio.sleep(0.05)
        await asyncio.sleep(0.3)
        valkey_cpu = cpu_seconds(server_pid)
        start_cpu = sum(cpu_seconds(p.pid) for p in workers.procs)
        await r.xgroup_setid(STREAM, keys.COMMAND_GROUP, "0", entries_read=0)
        seconds = await wait_drained(r, [STREAM], keys.COMMAND_GROUP, sizes.commands, timeout=600,
                                     alive=workers.check_alive)
        valkey_cpu = cpu_seconds(server_pid) - valkey_cpu
        worker_cpu = sum(cpu_seconds(p.pid) for p in workers.procs) - start_cpu
    finally:
        workers.stop()
        await r.aclose()
    outcomes = await check_replies(url, sizes.commands)
    rate = sizes.commands / seconds
    log(f"  {count} worker(s): {sizes.commands} commands in {seconds:.2f} s = {rate:,.0f} commands/s; "
        f"outcomes {outcomes}; CPU: valkey {valkey_cpu:.1f} s, worker(s) {worker_cpu:.1f} s")
    return {"seconds": seconds, "rate": rate, "outcomes": outcomes, "valkey_cpu_s": valkey_cpu,
            "worker_cpu_s": worker_cpu}


async def phase_raw(url: str, sizes: Sizes) -> dict:
    await flush(url)
    import random

    recipients = [f"r{i}" for i in range(sizes.trees * sizes.children)]
    rng = random.Random(42)
    order = [rng.randrange(len(recipients)) for _ in range(sizes.commands)]
    r = aioredis.Redis.from_url(url)
    try:
        await raw.prefill(r, recipients, sizes.commands, order)
    finally:
        await r.aclose()
    valkey_cpu, own_cpu = cpu_seconds(VALKEY_PID), time.process_time()
    seconds, decided = await raw.run_worker(url, sizes.commands)
    valkey_cpu, own_cpu = cpu_seconds(VALKEY_PID) - valkey_cpu, time.process_time() - own_cpu
    rate = decided / seconds
    log(f"  raw: {decided} commands in {seconds:.2f} s = {rate:,.0f} commands/s; CPU: valkey {valkey_cpu:.1f} s, "
        f"worker {own_cpu:.1f} s")
    return {"seconds": seconds, "rate": rate, "valkey_cpu_s": valkey_cpu, "worker_cpu_s": own_cpu}


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


async def fill_history(host: Treemail, sender_id: str, recipient_id: str, events: int) -> int:
    """Give the recipient a stream of ~`events` events as if that much mail had come and gone.

    Version 2 is the sender's ProducerRegistered, then (Accepted, Consumed) pairs
    with entry ids "<n>-0". The snapshot is the real fold (evolve) of these
    events: every pair leaves the state unchanged, so folding one pair is the
    fold of all of them. No mail is pending, so the pending-mail hash stays empty.
    """
    record = await host.sessions.record(recipient_id)
    sender = await host.sessions.record(sender_id)
    stream = keys.session_stream(record.partition, record.session_id)
    loaded = await host.store.load(record)
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
    await host.redis.xadd(stream, dict(zip(("type", "data"), ev.encode(registered))), id=f"{first}-0")
    acc_pre, acc_post = ev.encode(accepted)[1].split("__MID__")
    con_pre, con_post = ev.encode(consumed)[1].split("__MID__")
    script = host.redis.register_script(FILL_LUA)
    pairs = max(1, (events - 2) // 2)
    n, step = first + 1, 50_000
    last = first
    for start in range(0, pairs, step):
        count = min(step, pairs - start)
        last = int(await script(keys=[stream], args=[n, count, acc_pre, acc_post, con_pre, con_post, "old-"]))
        n = last + 1
    await host.redis.hset(keys.session_snapshot(record.partition, record.session_id),
                          mapping={"version": last, "snapshot": state.to_json()})
    return last


async def phase_history(url: str, sizes: Sizes) -> dict:
    await flush(url)
    workers = Workers(url)
    host = await Treemail.connect(bench_config(url), url)
    try:
        # The two recipients are roots; their children send to them ("parent"), taking turns, so no
        # sender reaches the per-source capacity (nobody consumes).
        (big, big_kids), (fresh, fresh_kids) = await register_trees(host, 2, HISTORY_SENDERS, run_on="children")
        senders = {big: big_kids, fresh: fresh_kids}
        t = time.perf_counter()
        last = await fill_history(host, big_kids[0], big, sizes.big_events)
        length = await host.redis.xlen(keys.session_stream((await host.sessions.record(big)).partition, big))
        info = await host.redis.info("memory")
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
        big_record = await host.sessions.record(big)
        version_after = int(await host.redis.hget(keys.session_snapshot(big_record.partition, big), "version"))
    finally:
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


async def phase_scale(url: str, sizes: Sizes, cluster: bool, server_pids: list[int]) -> list[dict]:
    rows = []
    for count in SCALE_WORKERS:
        rows.append(await scale.run_one(url, cluster, server_pids, count, sizes.scale_trees, sizes.scale_children,
                                        sizes.scale_commands, sizes.scale_streams, log))
    return rows


def run_cluster_phase(sizes: Sizes) -> list[dict]:
    from treemail.adapters.embedded import LocalValkeyCluster

    cluster = LocalValkeyCluster(masters=3)
    try:
        cluster.start()
        pids = [node.process.pid for node in cluster.nodes]
        log(f"  local cluster of {len(pids)} masters at {cluster.url}")
        return asyncio.run(phase_scale(cluster.url, sizes, True, pids))
    finally:
        cluster.cleanup()


def run_durable_phase(sizes: Sizes) -> dict:
    """Phase 1 again on a Valkey with AOF, workers in the durable profile (WAITAOF before success)."""
    server = LocalValkey(durable=True)
    try:
        server.start()
        return asyncio.run(phase_workers(server.url, sizes, 1, {"TREEMAIL_SERVICE_PROFILE": "durable"},
                                         server.process.pid))
    finally:
        server.cleanup()


def verdict(ok: bool) -> str:
    return "met" if ok else "NOT met"


def rounds_of(figures: dict, key: str) -> str:
    """Each latency round's own figure: '0.91 / 0.95 / 1.02 ms' (the row's value is over all their sends)."""
    return " / ".join(f"{round_[key]:.2f}" for round_ in figures["rounds"]) + " ms"


def report(results: dict, env: dict, sizes: Sizes, quick: bool, wall: float) -> str:
    one, two, rawr = results["one"], results["two"], results["raw"]
    lat, hist, low = results["latency"], results["history"], results["latency_low"]
    ratio_raw = one["rate"] / rawr["rate"]
    ratio_two = two["rate"] / one["rate"]
    rows = [
        ("treemail, 1 worker process", f"{one['rate']:,.0f} commands/s", f"{sizes.commands:,} sends in {one['seconds']:.2f} s", ""),
        ("raw Redis baseline, 1 process", f"{rawr['rate']:,.0f} commands/s", f"{sizes.commands:,} sends in {rawr['seconds']:.2f} s", ""),
        ("treemail / raw", f"{ratio_raw:.2f}", "target >= 0.7", verdict(ratio_raw >= 0.7)),
    ]
    for who, key, target in (("worker", "worker_cpu_s", 1.5), ("Valkey", "valkey_cpu_s", 2.0)):
        mine, base = one[key] / sizes.commands * 1e6, rawr[key] / sizes.commands * 1e6
        rows.append((f"{who} CPU per decision, treemail / raw", f"{mine / base:.2f}",
                     f"{mine:.0f} us vs {base:.0f} us, target <= {target:g}", verdict(mine / base <= target)))
    dur, mem = results["durable"], results["memory"]
    ratio_dur = dur["rate"] / one["rate"]
    rows += [
        ("treemail, 1 worker, durable profile", f"{dur['rate']:,.0f} commands/s",
         f"{sizes.commands:,} sends in {dur['seconds']:.2f} s, outcomes {dur['outcomes']}", ""),
        ("durable / fast", f"{ratio_dur:.2f}", "target >= 0.6", verdict(ratio_dur >= 0.6)),
        (f"memory per accepted {mem['body_bytes']}-byte message", f"{mem['bytes_per_message']:,.0f} bytes",
         f"{mem['accepted']:,} sends, used_memory delta", ""),
        ("bare XADD of the same body", f"{mem['bare_xadd_bytes']:,.0f} bytes", "", ""),
        ("memory treemail / bare", f"{mem['ratio']:.2f}", "target <= 2.5", verdict(mem["ratio"] <= 2.5)),
        ("command stream length after the run", f"{mem['command_stream_len_after_run']:,} entries",
         f"{mem['command_stream_len_after_trim']:,} after the worker's trim pass; reply lists left: "
         f"{mem['reply_lists_left']}", ""),
    ]
    mil = results["million"]
    rows += [
        (f"after {mil['sends']:,} sends: command stream", f"{mil['command_stream_after']:,} entries",
         f"at most {mil['command_stream_peak']:,} while fed; reply lists {mil['reply_lists_left']}, wake entries "
         f"{mil['wake_entries_after']}", ""),
        (f"after {mil['sends']:,} sends: memory per send", f"{mil['bytes_per_send']:,.0f} bytes",
         f"by kind of key in the JSON (million.by_kind); {mil['answers'].get('ok', 0):,} accepted", ""),
    ]
    rows += [
        ("treemail, 2 worker processes", f"{two['rate']:,.0f} commands/s", f"{sizes.commands:,} sends in {two['seconds']:.2f} s", ""),
        ("2 workers / 1 worker", f"{ratio_two:.2f}", "target >= 1.3", verdict(ratio_two >= 1.3)),
        (f"send round trip p50 at {lat['target_rate']:,}/s", f"{lat['p50_ms']:.2f} ms",
         f"achieved {lat['achieved_rate']:,.0f} sends/s; rounds {rounds_of(lat, 'p50_ms')}; target <= 1 ms",
         verdict(lat["p50_ms"] <= 1.0)),
        (f"send round trip p99 at {lat['target_rate']:,}/s", f"{lat['p99_ms']:.2f} ms",
         f"{lat['ok']:,} sends ({lat['failed']} failed); rounds {rounds_of(lat, 'p99_ms')}; target <= 5 ms",
         verdict(lat["p99_ms"] <= 5.0)),
        (f"send round trip at {low['target_rate']:,}/s", f"p50 {low['p50_ms']:.2f} ms", f"p99 {low['p99_ms']:.2f} ms, {low['ok']:,} sends ({low['failed']} failed)", ""),
    ]
    for pace in (lat, low):
        rt = pace["raw"]
        rows += [
            (f"raw XADD + BLMPOP round trip at {pace['target_rate']:,}/s", f"p50 {rt['p50_ms']:.2f} ms",
             f"p99 {rt['p99_ms']:.2f} ms, {rt['ok']:,} sends ({rt['failed']} failed), same process, pace, concurrency",
             ""),
            (f"host CPU per send at {pace['target_rate']:,}/s, treemail / raw", f"{pace['host_cpu_ratio']:.2f}",
             f"{pace['host_cpu_us_per_send']:.0f} us vs {rt['host_cpu_us_per_send']:.0f} us; answers per pop "
             f"{pace['answers_per_listener_wakeup']:.1f} vs {rt['answers_per_listener_wakeup']:.1f}", ""),
        ]
    rows += [
        (f"send p50, {hist['events']:,}-event recipient", f"{hist['big_p50_ms']:.2f} ms", f"p99 {hist['big_p99_ms']:.2f} ms, {hist['events']:,} events", ""),
        ("send p50, fresh recipient", f"{hist['fresh_p50_ms']:.2f} ms", f"p99 {hist['fresh_p99_ms']:.2f} ms", ""),
        ("long / fresh stream (p50)", f"{hist['ratio_p50']:.2f}", "target <= 1.2", verdict(hist["ratio_p50"] <= 1.2)),
    ]
    pop = results["sessions"]
    rows += [
        (f"memory per registered session, {pop['sessions']:,} sessions", f"{pop['bytes_per_session']:,.0f} bytes",
         f"used_memory delta, {pop['keys_per_session']:.1f} keys per session, registered at "
         f"{pop['register_rate']:,.0f}/s", ""),
        (f"send p50, {pop['sessions']:,}-session server", f"{pop['populated_p50_ms']:.2f} ms",
         f"p99 {pop['populated_p99_ms']:.2f} ms", ""),
        (f"send p50, fresh server ({pop['fresh_sessions']} sessions)", f"{pop['fresh_p50_ms']:.2f} ms",
         f"p99 {pop['fresh_p99_ms']:.2f} ms", ""),
        ("populated / fresh server (p50)", f"{pop['ratio_p50']:.2f}", "target <= 1.2", verdict(pop["ratio_p50"] <= 1.2)),
    ]
    rep = results["replay"]
    rows += [
        ("replay: rebuild(write=False), 1 process", f"{rep['replay_rate']:,.0f} events/s",
         f"{rep['events']:,} events, {rep['sessions']} sessions, in {rep['replay_seconds']:.2f} s", ""),
        ("replay: raw XRANGE + json.loads", f"{rep['raw_rate']:,.0f} events/s",
         f"{rep['raw_events']:,} events in {rep['raw_seconds']:.2f} s", ""),
        ("replay / raw", f"{rep['ratio']:.2f}", "target >= 0.7", verdict(rep["ratio"] >= 0.7)),
        ("replay: rebuild(write=True), 1 process", f"{rep['write_rate']:,.0f} events/s",
         f"{rep['write_events']:,} events in {rep['write_seconds']:.2f} s, {rep['write_ratio']:.2f} of raw", ""),
    ]
    for key, where in (("scale_single", "one Valkey"), ("scale_cluster", "3-master cluster")):
        base = results[key][0]["rate"]
        for row in results[key]:
            rows.append((f"{where}, {row['workers']} worker(s), {sizes.scale_streams} cmd streams",
                         f"{row['rate']:,.0f} commands/s",
                         f"{sizes.scale_commands:,} sends in {row['seconds']:.2f} s, x{row['rate'] / base:.2f} vs 1 worker, "
                         f"noise {row['other_cpu_s'] / row['seconds']:.2f} cores",
                         ""))
    widths = [max(len(r[i]) for r in rows) for i in range(4)]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(r, widths)).rstrip() for r in rows]
    header = (f"{'QUICK smoke run (not the reference figures); ' if quick else ''}"
              f"CPU {env['cpu']}, {env['cores']} cores, Python {env['python']}, {env['valkey']}, {env['os']}; "
              f"`make bench` took {wall:.0f} s")
    return header + "\n\n" + "\n".join(lines)


# Everything after this marker in BENCHMARKS.md is hand-written analysis; a new run keeps it.
NOTES_MARKER = "<!-- notes: kept across runs -->"


def write_markdown(table: str, results: dict, env: dict, sizes: Sizes, quick: bool) -> None:
    path = ROOT / "BENCHMARKS.md"
    outcomes = results["one"]["outcomes"]
    text = f"""# Benchmarks

Produced by `make bench` (`python -m bench.run{' --quick' if quick else ''}`) on {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}.
Everything below was measured in one run against one local Valkey started by the
benchmark (`LocalValkey(durable=False)`, profile `fast`), flushed between phases (`FLUSHALL SYNC`:
a phase starts once the server has freed the last one's keys), except the cluster rows: a local
3-master `LocalValkeyCluster(masters=3)` started by the same run.

Machine: {env['cpu']}, {env['cores']} cores, Python {env['python']}, {env['valkey']}, {env['os']}.
Valkey, the worker process(es) and the benchmark process share these cores.

```
{table}
```

## What each row measures

- **treemail, 1 worker process**: {sizes.trees} trees of 1 root + {sizes.children} children registered
  through the host API ({sizes.trees * sizes.children:,} recipients, `max_pending_per_session` 1e9,
  `max_inflight_per_pair` 0, one command stream); {sizes.commands:,} `SendMessage` commands
  (the roots take turns, each to a random child of its tree, by session id, unique tool-call ids, a dummy reply list)
  XADDed to the command stream; the group cursor is held at the end (`XGROUP SETID $`) until
  the worker process(es) have started and joined the group, then rewound to 0, so start-up is
  not timed. Time runs from the group's first read until `XINFO GROUPS` shows pending = 0 and
  lag = 0; CPU seconds of Valkey and the workers are read from /proc over the same span. Outcomes of the
  1-worker run: {outcomes}.
- **raw Redis baseline**: the same backlog shape decided by a plain `redis.asyncio` loop in the
  benchmark process: `XREADGROUP COUNT 100`, pipelined `HMGET` of each recipient's state hash,
  accept, one pipelined Lua compare-and-set per command (check `version`, `XADD`, `HSET version`),
  one `XACK` per batch. No idempotency record, no snapshot JSON, no reply.
- **2 worker processes**: as the first row, with two `treemail worker` processes in one group.
- **send round trip**: one worker process; a host (`Treemail.connect`, same config) paced at
  {sizes.latency_rate:,} sends/s (and again at {sizes.latency_rate // 4:,} sends/s) for {sizes.latency_seconds:g} s
  each, with every send its own task, held only while it runs
  (many in flight); `send_message` call to result, 20 roots taking turns, each to its 5 children.
  At each rate {sizes.latency_rounds} round(s) (`bench/latency.py`), each on a flushed server with
  its own worker and followed by the raw round trip below: p50, p99 and CPU per send are over
  every send of the rounds together, and each round's own p50 and p99 are listed in the row, so a
  bad round shows. One 5-second run was a draw on this machine (fourteen runs of one commit: p50
  0.90-1.13 ms, p99 2.28-8.89 ms).
- **raw XADD + BLMPOP round trip**: right after each round of the send round trip, in the same benchmark
  process, the same pace, concurrency (every send its own task), senders, recipients and bodies, through
  `bench/roundtrip.py`'s client shaped like treemail's producer (`producers/client.py`): each send
  XADDs a command-sized entry (the JSON `encode_command` writes) to a stream and awaits a future;
  one listener task per client BLMPOPs the client's one reply list (up to 1000 answers a pop) and
  hands each answer to its future by command id. The consumer is a subprocess, as the worker is:
  `XREADGROUP COUNT 100 BLOCK 100`, one pipelined `LPUSH` + `EXPIRE` per reply list and `XACK` per
  batch, deciding nothing. Host CPU per send is the benchmark process's CPU time over the paced span
  divided by the sends, for both loops (the pacer and the client's listener included); the ratio
  has no target in the issue, it is reported. It depends on how the consumer batches: a consumer
  that falls behind answers many sends per `LPUSH`, and the host then wakes once for many answers
  (answers per pop, shown next to it), so a slower consumer can lower the host's CPU per send.
- **replay**: {results['replay']['sessions']} sessions ({sizes.replay_trees} trees of 1 root + {sizes.replay_children} children)
  registered through the host API (directory entry, partition session set, SessionRegistered at
  version 1), then each stream filled by a server-side Lua loop with ProducerRegistered +
  (ProducerMessageAccepted, ProducerMessageConsumed) pairs of real event JSON at ids `<n>-0`, about
  {sizes.replay_events:,} events per session. `projections.replay.rebuild(store, all {bench_config('').service.partitions} partitions,
  write=False)` with a fresh `EventStore` (empty directory cache), all four projections, in the
  benchmark process; the raw loop in the same process and run: `SMEMBERS` of each partition's
  session set, `XRANGE` in chunks of 10,000 and `json.loads` of every `data` field over the same
  streams. Next to it `rebuild(..., write=True)`, the rebuild `treemail replay` runs: the same fold,
  then each partition's views and checkpoints written in one MULTI/EXEC. Raw, rebuild and
  rebuild-with-writing alternate twice; the best of two of each is shown. The folded views are
  checked (and the written rebuild's must equal them): {results['replay']['views_check']}.
- **scale-out**: {sizes.scale_trees} trees of 1 root + {sizes.scale_children} children, roots chosen so that each of
  {sizes.scale_streams} command streams gets the same number of senders; {sizes.scale_commands:,} `SendMessage`
  commands (root -> random child of its tree), each XADDed to `keys.command_stream(crc32(sender) % {sizes.scale_streams})`
  as `producers/client.py` routes them; then 1, 2 and 4 `treemail worker` processes
  (`TREEMAIL_SERVICE_COMMAND_STREAMS={sizes.scale_streams}`), timed as the first row over all streams. Each row
  re-registers and re-fills a flushed server. Once on the benchmark's single Valkey, once on a
  local 3-master `LocalValkeyCluster` (no replicas, same 2 cores; workers with
  `TREEMAIL_SERVICE_CLUSTER=true`, prefill and progress through a `RedisCluster` client). The backlog
  is {sizes.scale_commands:,} commands, smaller than the first rows', to keep `make bench` short.
- **~1M-event recipient**: one child's stream pre-filled with ProducerRegistered + (Accepted,
  Consumed) pairs at entry ids `<n>-0` and its state hash set to version n and the real fold's
  snapshot; {sizes.probe_sends:,} sequential sends to it interleaved with {sizes.probe_sends:,} to a
  fresh child, one worker.
- **after {sizes.million_sends:,} sends** (`bench/million.py`): one worker; a producer in the benchmark
  process XADDs the commands in chunks of 10,000 (1 root + 1 child per tree, enough roots that none
  reaches the per-source capacity; nobody consumes), never more than 50,000 undecided, and a reader
  takes the answers off the reply list as a host does. After the last answer the worker's periodic
  pass (every `reclaim_idle_ms / 2`) gets up to 20 s. The command stream's length, the reply lists
  and wake entries left are then read, and every key's `MEMORY USAGE` is summed by kind of key (the
  bytes per send that remain: the session streams, the feed bounded by `feed_maxlen`, and the records
  each message keeps until it is processed or as long as its sender).
- **{results['sessions']['sessions']:,}-session server**: trees of 1 root + 9 children registered through
  the host API (`register_root`, `register_child`, all `idle`; SessionRegistered decided and committed
  as every registration is), 16 trees in flight at once from one process (one tree at a time does
  about half the rate on this machine); {results['sessions']['register_seconds']:.0f} s for all of them. Memory per
  session is Valkey's `used_memory` after minus before the registration, divided by the sessions
  counted in the partitions' session sets; by kind of key (`MEMORY USAGE`, on the fresh server's
  {results['sessions']['fresh_sessions']} sessions before any mail), in bytes per session:
  {results['sessions']['fresh_key_bytes_per_session_by_kind']}. The baseline is a second, fresh
  `LocalValkey` started for the phase holding only 5 trees registered the same way, with its own worker
  process; on each server the 9 children of 5 trees (spread over the population on the big one) open a
  run and send to their root. Every pair sends once to warm up, then {sizes.probe_sends:,} sequential
  sends to each server alternate send by send, so both see the same moments of the shared machine; a
  fresh session on the populated server would share the keyspace whose size is what is measured.

Raw figures of this run (JSON):

```
{json.dumps(results, indent=1, default=str)}
```
"""
    notes = ""
    if path.exists() and NOTES_MARKER in path.read_text():
        notes = path.read_text().split(NOTES_MARKER, 1)[1]
    path.write_text(text + "\n" + NOTES_MARKER + notes)


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
    parser.add_argument("--only", default="", help="comma-separated phases (one,raw,durable,memory,two,latency,latency_low,history,sessions,"
                        "replay,scale_single,scale_cluster); implies --no-write")
    args = parser.parse_args(argv)
    only = [p for p in args.only.split(",") if p]
    quick = args.quick or os.environ.get("BENCH_QUICK", "") not in ("", "0")
    sizes = QUICK if quick else FULL
    started = time.perf_counter()
    server = LocalValkey(durable=False)
    try:
        server.start()
        global VALKEY_PID
        VALKEY_PID = server.process.pid
        url = server.url
        env = machine()
        env["valkey"] = asyncio.run(valkey_version(url))
        log(f"Valkey at {url}; {env['cpu']}, {env['cores']} cores, Python {env['python']}, {env['valkey']}")
        results = {}
        phases = [
            ("one", "phase 1: one treemail worker process", lambda: asyncio.run(phase_workers(url, sizes, 1))),
            ("raw", "phase 2: raw Redis baseline", lambda: asyncio.run(phase_raw(url, sizes))),
            ("durable", "phase 3b: one worker, durable profile (AOF + WAITAOF), on its own Valkey",
             lambda: run_durable_phase(sizes)),
            ("memory", "phase 3c: memory per accepted message vs a bare XADD",
             lambda: asyncio.run(memory.phase_memory(url, sizes.memory_sends, log))),
            ("million", f"phase 3d: {sizes.million_sends:,} sends through one worker: what is left",
             lambda: asyncio.run(million.phase_million(url, sizes.million_sends, log))),
            ("two", "phase 3: two treemail worker processes", lambda: asyncio.run(phase_workers(url, sizes, 2))),
            ("latency", "phase 4: producer round-trip latency",
             lambda: asyncio.run(latency.phase_latency(url, sizes.latency_rate, sizes.latency_seconds,
                                                       sizes.latency_rounds, log))),
            ("latency_low", "phase 4b: the same at a quarter of the rate",
             lambda: asyncio.run(latency.phase_latency(url, sizes.latency_rate // 4, sizes.latency_seconds,
                                                       sizes.latency_rounds, log))),
            ("history", "phase 5: decision latency on a long stream", lambda: asyncio.run(phase_history(url, sizes))),
            ("sessions", f"phase 5b: {sizes.sessions:,} sessions on one Valkey: memory per session, decision latency "
                         "vs a fresh server", lambda: asyncio.run(population.phase_sessions(url, sizes.sessions,
                                                                                           sizes.probe_sends, log))),
            ("replay", "phase 6: projection replay rate vs raw XRANGE + json.loads",
             lambda: asyncio.run(phase_replay(url, sizes))),
            ("scale_single", f"phase 7: scale-out, {SCALE_WORKERS} worker processes, one Valkey, "
                             f"{sizes.scale_streams} command streams",
             lambda: asyncio.run(phase_scale(url, sizes, False, [VALKEY_PID]))),
            ("scale_cluster", f"phase 8: scale-out, {SCALE_WORKERS} worker processes, local 3-master Valkey Cluster, "
                              f"{sizes.scale_streams} command streams",
             lambda: run_cluster_phase(sizes)),
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
