"""Phase 11: the web page's history cache (``projections.mailboxes.HistoryCache``) with large bodies.

The cache is bounded in bytes, estimated per event (``mailboxes.event_bytes``: the event's text and a fixed
overhead). This phase fills sessions whose mail has 16 KB bodies, reads them all through a cache whose budget
holds about half of them, and reports what the cache keeps against its budget: the estimate, and what the kept
histories really hold in the process (tracemalloc, a pass of its own, since tracing allocations slows the reads
it would time). It also says what the former bound (500,000 events) would have let the page hold at this size.
"""

import gc
import time
import tracemalloc

from treemail.adapters import keys
from treemail.domain import events as ev
from treemail.host import Treemail
from treemail.projections import mailboxes

from .common import bench_config, flush, open_server, percentile

BODY_BYTES = 16 * 1024
FORMER_BOUND_EVENTS = 500_000


async def _fill(server, sender_id: str, session_id: str, messages: int) -> int:
    """``messages`` accepted and consumed messages of BODY_BYTES on the session's stream, as the page reads
    them; the snapshot's version says how far the stream goes (what the cache compares)."""
    record = await server.sessions.record(session_id)
    stream = keys.session_stream(record.partition, session_id)
    version = (await server.store.load(record)).version
    body = ("sixteen kilobytes of report " * (BODY_BYTES // 28 + 1))[:BODY_BYTES]
    async with server.redis.pipeline(transaction=False) as pipe:
        for n in range(messages):
            message_id = f"m-{session_id[-8:]}-{n}"
            accepted = ev.ProducerMessageAccepted(at=time.time(), message_id=message_id, sender_session_id=sender_id,
                                                  sender_handle="bench_00000000", body=body, run_id="run-1",
                                                  tool_call_id=f"call-{n}")
            consumed = ev.ProducerMessageConsumed(at=time.time(), message_id=message_id, owner="agent",
                                                  sender_session_id=sender_id, run_id="run-1")
            for event in (accepted, consumed):
                version += 1
                pipe.xadd(stream, dict(zip(("type", "data"), ev.encode(event))), id=f"{version}-0")
        pipe.hset(keys.session_snapshot(record.partition, session_id), "version", version)
        await pipe.execute()
    return version


async def phase_history_cache(url: str, sessions: int, messages: int, budget_bytes: int, log) -> dict:
    await flush(url)
    host = await Treemail.connect(bench_config(url), url)
    server = await open_server(url)
    try:
        root = await host.register_root("planner", "bench", rules={"child": "allow"})
        ids = [(await host.register_child(root.session_id, "explore", f"child {i}")).session_id
               for i in range(sessions)]
        for session_id in ids:
            await _fill(server, root.session_id, session_id, messages)
        # Timed pass: each session read whole once, then again with nothing appended (what a live page does).
        cache = mailboxes.HistoryCache(server.store, budget_bytes)
        whole, again = [], []
        for session_id in ids:
            t = time.perf_counter()
            await cache.read(session_id)
            whole.append(time.perf_counter() - t)
        kept = [sid for sid in ids if sid in cache]
        for session_id in kept:
            t = time.perf_counter()
            await cache.read(session_id)
            again.append(time.perf_counter() - t)
        estimate = cache.bytes
        # Measured pass: what a fresh cache's kept histories hold, read the same way.
        del cache
        gc.collect()
        tracemalloc.start()
        before = tracemalloc.get_traced_memory()[0]
        measured = mailboxes.HistoryCache(server.store, budget_bytes)
        for session_id in ids:
            await measured.read(session_id)  # the copy it returns is dropped at once
        gc.collect()
        held = tracemalloc.get_traced_memory()[0] - before
        tracemalloc.stop()
        events_kept = 0
        for session_id in ids:
            if session_id in measured:
                events_kept += len(await measured.read(session_id))
    finally:
        await server.close()
        await host.close()
    per_event = held / max(events_kept, 1)
    out = {
        "sessions": sessions, "events_per_session": 2 * messages, "body_bytes": BODY_BYTES,
        "budget_bytes": budget_bytes, "kept_sessions": len(kept), "estimate_bytes": estimate, "held_bytes": held,
        "estimate_over_held": estimate / held if held else 0.0,
        "read_whole_p50_ms": percentile(whole, 50) * 1000, "read_again_p50_ms": percentile(again, 50) * 1000,
        "former_bound_bytes": per_event * FORMER_BOUND_EVENTS,
    }
    log(f"  {sessions} sessions x {2 * messages} events, {BODY_BYTES:,}-byte bodies, budget "
        f"{budget_bytes / 2**20:.0f} MiB: kept {len(kept)}; estimate {estimate / 2**20:.1f} MiB, held "
        f"{held / 2**20:.1f} MiB; read whole p50 {out['read_whole_p50_ms']:.1f} ms, again "
        f"{out['read_again_p50_ms']:.2f} ms; 500,000 such events: {out['former_bound_bytes'] / 2**30:.1f} GiB")
    return out
