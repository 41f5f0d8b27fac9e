"""Phase 4d: an urgent steer behind 100 queued messages, next to a normal one.

A running recipient has 100 steer messages of chatter from one sibling waiting; then its parent sends
one probe, urgent or normal (alternating trials, a fresh recipient each), and the recipient claims at
its next step boundary. Measured: the time from the probe's send until the recipient's claim returns
it, and where it stands in what that claim hands out (the order an engine renders into the request).
A claim takes everything due at once, so both arrive with the same claim: priority decides whether the
probe is read first or after the chatter (a normal one is passed by at most the starvation bound).
"""

import time

from treemail.host import SendContext, Treemail

from .common import Workers, bench_config, flush, percentile

CHATTER = 100


async def phase_priority(url: str, trials: int, log) -> dict:
    await flush(url)
    workers = Workers(url)
    host = await Treemail.connect(bench_config(url), url)
    measured: dict[bool, list[tuple[float, int, int]]] = {True: [], False: []}
    try:
        workers.start(1)
        root = await host.register_root("planner", "bench", rules={"*": "allow"})
        await host.start_run(root.session_id, "run-1")
        for trial in range(trials * 2):
            urgent = trial % 2 == 0
            child = await host.register_child(root.session_id, "kid", "bench", rules={"*": "allow"})
            chatty = await host.register_child(root.session_id, "peer", "bench", rules={"*": "allow"})
            for session in (child, chatty):
                await host.start_run(session.session_id, "run-1")
            for i in range(CHATTER):
                sent = await host.send_message(SendContext(chatty.session_id, "run-1", f"chat-{trial}-{i}"),
                                               {"to": child.handle, "body": f"fyi {i}"})
                if "message_id" not in sent:
                    raise RuntimeError(f"send failed: {sent}")
            started = time.perf_counter()
            probe = await host.send(root.session_id, child.handle, "stop and report", urgent=urgent)
            claimed = await host.claim(child.session_id, "run-1")
            elapsed = time.perf_counter() - started
            index = [d.message_id for d in claimed].index(probe["message_id"])
            measured[urgent].append((elapsed, index, len(claimed)))
        workers.check_alive()
    finally:
        await host.close()
        workers.stop()

    def summary(rows: list[tuple[float, int, int]]) -> dict:
        latencies = [r[0] for r in rows]
        return {"p50_ms": percentile(latencies, 50) * 1000, "max_ms": max(latencies) * 1000,
                "position": max(r[1] for r in rows), "claimed": max(r[2] for r in rows)}

    out = {"chatter": CHATTER, "trials": trials, "urgent": summary(measured[True]), "normal": summary(measured[False])}
    for name in ("urgent", "normal"):
        row = out[name]
        log(f"  {name} steer behind {CHATTER} queued: send to claim p50 {row['p50_ms']:.2f} ms "
            f"(max {row['max_ms']:.2f}), read at position {row['position']} of {row['claimed']}")
    return out
