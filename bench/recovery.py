"""Phase 4g: how soon a worker decides again after a short server outage.

A durable Valkey of its own (its command streams and group survive the restart) and one worker. Each
round sends once on the healthy server (the baseline: a decision's round trip in the same run), then
kills the server with SIGKILL, starts it again 0.3 s later on the same port and directory, and times
the first send made 0.5 s after it is back: how long it waits for a decision, with the same call sent
again while the host's pooled connections meet the restart. The ratio is that wait over the healthy
round trip; what the worker must not do is wait for a reclaim or a long reconnection backoff.
"""

import asyncio
import time

from treemail.adapters.embedded import LocalValkey
from treemail.host import SendContext, Treemail

from .common import Workers, bench_config, percentile

OUTAGE_S = 0.3
BACK_FOR_S = 0.5  # the server is back and answers before the send is made


async def phase_recovery(rounds: int, log) -> dict:
    server = LocalValkey(durable=True).start()
    workers = Workers(server.url)
    try:
        host = await Treemail.connect(bench_config(server.url), server.url)
        try:
            root = await host.register_root("planner", "bench", rules={"child": "allow"})
            child = await host.register_child(root.session_id, "explore", "bench")
            await host.start_run(root.session_id, "run-1")
            workers.start(1)
            await decided_in(host, SendContext(root.session_id, "run-1", "warm-up"), child.handle)  # worker is up
            healthy, after = [], []
            for n in range(rounds):
                healthy.append(await decided_in(host, SendContext(root.session_id, "run-1", f"healthy-{n}"),
                                                child.handle))
                await asyncio.sleep(1.5)  # everysec: what was appended is in the append-only file
                await asyncio.to_thread(server.stop, True)
                await asyncio.sleep(OUTAGE_S)
                await asyncio.to_thread(server.start)
                await asyncio.sleep(BACK_FOR_S)
                after.append(await decided_in(host, SendContext(root.session_id, "run-1", f"after-{n}"),
                                              child.handle))
                log(f"round {n + 1}: decided {after[-1]:.3f} s after a {OUTAGE_S} s outage "
                    f"(healthy {healthy[-1] * 1000:.2f} ms)")
            workers.check_alive()
        finally:
            await host.close()
    finally:
        workers.stop()
        server.cleanup()
    healthy_p50, after_p50 = percentile(healthy, 50), percentile(after, 50)
    return {"rounds": rounds, "outage_s": OUTAGE_S, "healthy_p50_ms": healthy_p50 * 1000,
            "after_p50_s": after_p50, "after_max_s": max(after), "ratio": after_p50 / healthy_p50}


async def decided_in(host: Treemail, ctx: SendContext, to: str) -> float:
    """Seconds until the send is decided; the same call again while it meets connections the restart broke."""
    started = time.perf_counter()
    for _ in range(50):
        result = await host.send_message(ctx, {"to": to, "body": "x"})
        if "message_id" in result:
            return time.perf_counter() - started
    raise RuntimeError(f"not decided after the outage: {result}")
