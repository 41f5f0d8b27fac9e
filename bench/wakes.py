"""Phase 4c: wake latency, from the commit that requests a wake to a host runner holding its trigger.

Idle children are sent one message each at a steady pace (one worker); a runner reads the wake
triggers in its consumer group, as an engine's would, and notes when each arrived. The start is the
time the deciding worker dated the wake (``SessionWakeRequested.at``, the commit's own step), so the
figure covers the commit, the trigger's stream and the runner's blocking read: what a sleeping
session waits before its host can start the run. Same machine, same clock.
"""

import asyncio
import time

from treemail.host import SendContext, Treemail

from .common import MAX_OUTSTANDING, Workers, bench_config, flush, percentile

RATE = 200  # sends per second: a wake each; a steady trickle, not a flood


async def phase_wake_latency(url: str, sends: int, log) -> dict:
    await flush(url)
    workers = Workers(url)
    host = await Treemail.connect(bench_config(url), url)
    try:
        # Nobody consumes the mail, so each root sends at most its capacity of unsettled messages.
        roots = [await host.register_root("planner", "bench", rules={"*": "allow"})
                 for _ in range(-(-sends // MAX_OUTSTANDING))]
        for root in roots:
            await host.start_run(root.session_id, "run-1")
        kids = [(await host.register_child(roots[i // MAX_OUTSTANDING].session_id, "kid", "bench",
                                           rules={"*": "allow"}, status="idle"))
                for i in range(sends)]
        workers.start(1)
        arrived: dict[str, float] = {}
        done = asyncio.Event()

        async def runner() -> None:
            while len(arrived) < sends:
                # Not acknowledged (no run is started): a trigger read again later keeps its first arrival.
                for wake in await host.wakes("bench-runner", count=100, block_ms=200):
                    arrived.setdefault(wake.session_id, time.time())
            done.set()

        reading = asyncio.create_task(runner())
        started = time.perf_counter()
        for i, kid in enumerate(kids):
            result = await host.send_message(SendContext(roots[i // MAX_OUTSTANDING].session_id, "run-1", f"wake-{i}"),
                                             {"to": kid.handle, "body": "wake up"})
            if "message_id" not in result:
                raise RuntimeError(f"send failed: {result}")
            pause = started + (i + 1) / RATE - time.perf_counter()
            if pause > 0:
                await asyncio.sleep(pause)
        await asyncio.wait_for(done.wait(), 60)
        await reading
        workers.check_alive()
        latencies = []
        for kid in kids:
            requested = [e for _, e in await host.history(kid.session_id) if type(e).__name__ == "SessionWakeRequested"]
            latencies.append(arrived[kid.session_id] - requested[0].at)
    finally:
        await host.close()
        workers.stop()
    out = {"wakes": len(latencies), "rate": RATE, "p50_ms": percentile(latencies, 50) * 1000,
           "p99_ms": percentile(latencies, 99) * 1000, "max_ms": max(latencies) * 1000}
    log(f"  wake latency (commit to trigger): p50 {out['p50_ms']:.2f} ms, p99 {out['p99_ms']:.2f} ms "
        f"over {out['wakes']} wakes at {RATE}/s")
    return out
