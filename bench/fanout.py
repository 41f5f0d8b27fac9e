"""Phase 4d: subtree broadcast fan-out, from the call to each copy being claimable.

A root with 10 children of 9 children each (100 descendants) broadcasts one message
(``tm.peers.broadcast_subtree``) through two worker processes. A copy is claimable once its
``ProducerMessageAccepted`` is committed on the recipient's stream, so each copy's figure is that
event's time (dated by the deciding worker, same machine, same clock) minus the time of the call;
the call's own duration (until every copy is answered and the outcome recorded) is reported beside.
A fresh tree each round, so no copy waits behind an earlier round's; a first round, not counted,
waits for both workers to have joined.
"""

import time

from treemail.domain import events as ev
from treemail.host import Treemail

from .common import Workers, bench_config, flush, percentile

CHILDREN = 10
GRANDCHILDREN = 9  # per child: 10 + 10 * 9 = 100 descendants
WORKERS = 2


async def family(host: Treemail):
    root = await host.register_root("lead", "bench", rules={"*": "allow"})
    await host.start_run(root.session_id, "run-1")
    for _ in range(CHILDREN):
        child = await host.register_child(root.session_id, "planner", "bench", rules={"*": "allow"})
        for _ in range(GRANDCHILDREN):
            await host.register_child(child.session_id, "worker", "bench", rules={"*": "allow"})
    return root


async def phase_fanout(url: str, rounds: int, log) -> dict:
    await flush(url)
    workers = Workers(url)
    host = await Treemail.connect(bench_config(url), url)
    copies: list[float] = []
    calls: list[float] = []
    try:
        workers.start(WORKERS)
        for i in range(-1, rounds):
            root = await family(host)
            started = time.time()
            result = await host.peers.broadcast_subtree(root.session_id, f"stop and report ({i})")
            if result.get("refused") or len(result.get("delivered", ())) != CHILDREN * (1 + GRANDCHILDREN):
                raise RuntimeError(f"broadcast incomplete: {result}")
            if i < 0:
                continue  # the warm-up round
            calls.append(time.time() - started)
            for copy in result["delivered"]:
                [accepted] = [e for _, e in await host.history(copy["session_id"])
                              if isinstance(e, ev.ProducerMessageAccepted) and e.message_id == copy["message_id"]]
                copies.append(accepted.at - started)
        workers.check_alive()
    finally:
        await host.close()
        workers.stop()
    out = {"descendants": CHILDREN * (1 + GRANDCHILDREN), "rounds": rounds, "workers": WORKERS,
           "p50_ms": percentile(copies, 50) * 1000, "p99_ms": percentile(copies, 99) * 1000,
           "call_p50_ms": percentile(calls, 50) * 1000}
    log(f"  fan-out to {out['descendants']} descendants: each copy claimable p50 {out['p50_ms']:.1f} ms, "
        f"p99 {out['p99_ms']:.1f} ms; the whole call p50 {out['call_p50_ms']:.1f} ms ({rounds} rounds)")
    return out
