"""Phase 4: the send round trip at a steady rate, next to a bare XADD + BLMPOP round trip.

Each round is one treemail run (one worker, a paced host) and then the raw round trip at the same
pace, concurrency, senders and bodies. The percentiles are taken over every send of every round
together. One 5-second run is a draw on this 2-core machine: fourteen runs of one commit gave p50
0.90-1.13 ms and p99 2.28-8.89 ms (BENCHMARKS.md). Each round's own p50
and p99 are kept beside the pooled ones, so a bad round shows instead of vanishing into a median.
"""

import asyncio

from treemail.host import SendContext, Treemail

from . import roundtrip
from .common import Workers, bench_config, cpu_seconds, flush, percentile, register_trees, server_of

WARM_UP_SENDS = 200
# The round trip's targets are read at this share of one worker's capacity measured in the same run: at a
# fixed rate, a slower machine's worker runs near its limit and the round trip measures the queue (one that
# decided 2,372 commands/s gave p50 121-481 ms at 2,000/s), a faster one's idles between sends.
SHARE_OF_CAPACITY = 0.5


def paced_rate(one: dict | None, fallback: int) -> tuple[int, str]:
    """The rate the round trip's targets are read at, and what it is: ``SHARE_OF_CAPACITY`` of the one-worker
    phase's rate in this run (rounded down to tens), or ``fallback`` when the run did not measure it."""
    if not one:
        return fallback, f"the configured {fallback:,}/s: this run did not measure one worker's capacity"
    rate = max(10, int(one["rate"] * SHARE_OF_CAPACITY) // 10 * 10)
    return rate, f"{SHARE_OF_CAPACITY:g} of one worker's {one['rate']:,.0f} commands/s measured in this run"


def _ms(run: dict, q: float) -> float:
    return percentile(run["latencies"], q) * 1000


def pooled(runs: list[dict], cpu_keys: tuple[str, ...]) -> dict:
    """Rounds (each: latencies, failures, lateness, elapsed, sends, wakeups and the ``cpu_keys`` seconds)
    -> the figures over all of them, with each round's p50 and p99 (ms) in ``rounds``."""
    latencies = [x for run in runs for x in run["latencies"]]
    sends = sum(run["sends"] for run in runs)
    failures = [f for run in runs for f in run["failures"]]
    out = {
        "sends": sends, "ok": len(latencies), "failed": len(failures), "first_failure": failures[:1],
        "achieved_rate": sends / sum(run["elapsed"] for run in runs),
        "p50_ms": percentile(latencies, 50) * 1000, "p99_ms": percentile(latencies, 99) * 1000,
        "max_ms": max(latencies) * 1000 if latencies else float("nan"),
        "start_lateness_p99_ms": percentile([x for run in runs for x in run["lateness"]], 99) * 1000,
        "answers_per_listener_wakeup": sends / max(1, sum(run["wakeups"] for run in runs)),
        "rounds": [{"p50_ms": _ms(run, 50), "p99_ms": _ms(run, 99)} for run in runs],
    }
    for key in cpu_keys:
        out[f"{key}_us_per_send"] = sum(run[key] for run in runs) / sends * 1e6
    return out


async def reply_pops(url: str) -> int:
    """How many BLMPOPs the server has answered so far (INFO commandstats): in the treemail round only the
    host's reply listener pops with it, once per wake-up."""
    async with server_of(url) as server:
        stats = await server.redis.info("commandstats")
    return stats.get("cmdstat_blmpop", {}).get("calls", 0)


async def treemail_round(url: str, rate: int, total: int) -> dict:
    """One worker, one host paced at ``rate``; also the (root, child) pairs it sent between."""
    await flush(url)
    workers = Workers(url)
    host = await Treemail.connect(bench_config(url), url)
    try:
        # 20 senders (roots) of 5 children each, taking turns: nobody consumes, so each sender's
        # unsettled count grows by one per send and must stay under the per-source capacity.
        trees = await register_trees(host, 20, 5)
        pairs = [(root, kid) for root, kids in trees for kid in kids]
        workers.start(1)
        # Warm up: the worker has started and created its group; connections are open.
        for i in range(WARM_UP_SENDS):
            root, kid = pairs[i % len(pairs)]
            result = await host.send_message(SendContext(root, "run-1", f"w{i}"), {"to": kid, "body": "warm up"})
            if "message_id" not in result:
                raise RuntimeError(f"warm-up send failed: {result}")

        async def send(i: int) -> dict:
            root, kid = pairs[i % len(pairs)]
            return await host.send_message(SendContext(root, "run-1", f"call-{i}"),
                                           {"to": kid, "body": f"steady message {i}"})

        pops = await reply_pops(url)
        worker_cpu = cpu_seconds(workers.procs[0].pid)
        run = await roundtrip.paced(rate, total, send)
        run["worker_cpu"] = cpu_seconds(workers.procs[0].pid) - worker_cpu
        run["wakeups"] = await reply_pops(url) - pops
        workers.check_alive()
    finally:
        await host.close()
        workers.stop()
    return {**run, "sends": total, "pairs": pairs}


async def raw_round(url: str, pairs: list[tuple[str, str]], rate: int, total: int) -> dict:
    """The same pace, concurrency, senders and bodies as treemail's round, through XADD + BLMPOP to an echo."""
    await roundtrip.prepare(url)
    echo = roundtrip.start_echo(url)
    client = roundtrip.RawClient(url)
    try:
        async def send(i: int, prefix: str = "call") -> dict:
            root, kid = pairs[i % len(pairs)]
            answer = await client.request(root, "run-1", f"{prefix}-{i}", kid, f"steady message {i}")
            return answer.get("ok", answer)

        for i in range(WARM_UP_SENDS):  # as treemail's round: the echo has joined, connections are open
            if "message_id" not in await asyncio.wait_for(send(i, "w"), 30):
                raise RuntimeError("raw warm-up send failed")
        pops = roundtrip.count_calls(client.listener, "blmpop")
        echo_cpu = cpu_seconds(echo.pid)
        run = await roundtrip.paced(rate, total, send)
        run["echo_cpu"] = cpu_seconds(echo.pid) - echo_cpu
        run["wakeups"] = pops[0]
        if echo.poll() is not None:
            raise RuntimeError(f"echo consumer exited with {echo.returncode}")
    finally:
        await client.close()
        echo.terminate()
        echo.wait(timeout=10)
    return {**run, "sends": total}


async def phase_latency(url: str, rate: int, seconds: float, rounds: int, log, basis: str = "") -> dict:
    """``rounds`` rounds of ``seconds`` at ``rate``: treemail's figures, and the raw round trip's in ``raw``.
    ``basis``: why this rate (``paced_rate``), kept with the figures."""
    total = int(rate * seconds)
    if basis:
        log(f"  at {rate:,}/s: {basis}")
    mine, raws = [], []
    for round_ in range(rounds):
        run = await treemail_round(url, rate, total)
        mine.append(run)
        raws.append(await raw_round(url, run["pairs"], rate, total))
        log(f"  round {round_ + 1} of {rounds} at {rate:,}/s: treemail p50 {_ms(run, 50):.2f} ms, p99 "
            f"{_ms(run, 99):.2f} ms; raw p50 {_ms(raws[-1], 50):.2f} ms, p99 {_ms(raws[-1], 99):.2f} ms")
    out = {"target_rate": rate, "basis": basis, **pooled(mine, ("host_cpu", "worker_cpu"))}
    out["raw"] = pooled(raws, ("host_cpu", "echo_cpu"))
    out["host_cpu_ratio"] = out["host_cpu_us_per_send"] / out["raw"]["host_cpu_us_per_send"]
    for who, figures, cpu in (("latency", out, "worker"), ("raw round trip", out["raw"], "echo")):
        log(f"  {who}: {figures['ok']}/{figures['sends']} ok at {figures['achieved_rate']:,.0f} sends/s over "
            f"{rounds} round(s): p50 {figures['p50_ms']:.2f} ms, p99 {figures['p99_ms']:.2f} ms, max "
            f"{figures['max_ms']:.2f} ms (pacer lateness p99 {figures['start_lateness_p99_ms']:.2f} ms); CPU per send: "
            f"host {figures['host_cpu_us_per_send']:.0f} us, {cpu} {figures[f'{cpu}_cpu_us_per_send']:.0f} us; "
            f"{figures['answers_per_listener_wakeup']:.1f} answers per pop"
            + (f"; first failure {figures['first_failure'][0]}" if figures["failed"] else ""))
    log(f"  host CPU per send, treemail / raw round trip: {out['host_cpu_ratio']:.2f}")
    return out
