"""Scale-out and faults: a bounded soak. 200,000 sends through real worker processes, every one consumed.

Afterwards what treemail keeps per message (the session streams; each tool
call's idempotency record, kept as long as its sender) is measured and reported, and every
transient structure is back near empty: command and wake streams trimmed,
nothing pending, no reply lists, no dead letters, no pending mail or due
index, small snapshots. About three minutes on the 2-core machine the suite
was written on.
"""

import asyncio
import random
import time

import pytest
import redis.asyncio as aioredis

from treemail.adapters import keys
from treemail.adapters.embedded import LocalValkey
from treemail.host import SendContext

from .helpers import WorkerPool, config_for
from tests.integration.conftest import adapters, close_host, connect_host

SENDS = 200_000
SENDERS = 128
RUNNING, IDLE = 32, 8  # recipients: running ones claim in their run, idle ones are woken
# One sending root per recipient: each source may have at most 1000 unsettled messages (per-source capacity), so the
# load is spread over as many sources as a real tree of agents would be, not piled on a few.
ROOTS = RUNNING + IDLE
FEED_MAXLEN = 10_000
MESSAGING = {"max_pending_per_session": 1_000_000, "max_inflight_per_pair": 0, "max_outstanding_per_source": 1000}
BODY = "soak " * 20  # 100 bytes


async def scan_count(redis, pattern: str) -> int:
    return len([key async for key in redis.scan_iter(match=pattern, count=1000)])


async def memory(redis) -> tuple[int, int]:
    stats = await redis.memory_stats()
    return int((await redis.info("memory"))["used_memory"]), int(stats["dataset.bytes"])


@pytest.mark.slow
@pytest.mark.soak
@pytest.mark.expected_duration_s(120)
async def test_soak_keeps_only_history_and_returns_every_transient_structure_to_near_empty():
    server = LocalValkey(durable=False).start()
    try:
        config = config_for(server.url, decision_timeout_s=60, **MESSAGING)
        config = config.model_copy(update={"service": config.service.model_copy(update={"feed_maxlen": FEED_MAXLEN})})
        service = config.service
        extra = {"TREEMAIL_SERVICE_FEED_MAXLEN": str(FEED_MAXLEN)}
        async with WorkerPool(server.url, extra_env=extra, **MESSAGING) as pool:
            await pool.start(2)
            host = await connect_host(config, server.url)
            raw = aioredis.Redis.from_url(server.url)
            try:
                roots = [await host.register_root("planner", "x", rules={"child": "allow"}) for _ in range(ROOTS)]
                running = [await host.register_child(roots[n].session_id, "explore", "x", status="running")
                           for n in range(RUNNING)]
                idle = [await host.register_child(roots[RUNNING + n].session_id, "review", "x", status="idle")
                        for n in range(IDLE)]
                for child in running:
                    await host.start_run(child.session_id, "run-0")
                for root in roots:  # only a session's open run may send (exact live sender)
                    await host.start_run(root.session_id, "run-1")
                recipients = list(zip(roots, running + idle))
                baseline = await memory(raw)
                sent = consumed = waited = 0
                stream_peak = 0
                sending = asyncio.Event()
                sending.set()

                async def sender(n: int) -> None:
                    nonlocal sent, waited
                    rng = random.Random(n)
                    while sent < SENDS:
                        sent += 1
                        root, child = rng.choice(recipients)
                        for attempt in range(10_000):
                            ctx = SendContext(root.session_id, "run-1", f"{n}-{sent}-{attempt}")
                            result = await host.send_message(ctx, {"to": child.handle, "body": BODY})
                            if result.get("error", {}).get("code") != "send_message:source_capacity":
                                break
                            # A well-behaved agent at its per-source capacity waits for its mail to be read.
                            waited += 1
                            await asyncio.sleep(0.05)
                        assert "message_id" in result, result

                async def drain(session_id: str, run_id: str) -> int:
                    nonlocal consumed
                    deliveries = await host.claim(session_id, run_id)
                    for delivery in deliveries:
                        await host.consume(session_id, delivery.message_id)
                    consumed += len(deliveries)
                    return len(deliveries)

                async def running_runner(child) -> None:
                    while sending.is_set() or consumed < SENDS:
                        if not await drain(child.session_id, "run-0"):
                            await asyncio.sleep(0.2)

                async def wake_runner(n: int) -> None:
                    runs = 0
                    while sending.is_set() or consumed < SENDS:
                        for wake in await host.wakes(f"runner-{n}", count=4, block_ms=200):
                            runs += 1
                            run_id = f"wake-{n}-{runs}"
                            if await host.wake_run(wake, run_id):
                                await drain(wake.session_id, run_id)
                                await host.finish_run(wake.session_id, run_id)  # idle again; wakes if mail came

                async def watch_streams() -> None:
                    nonlocal stream_peak
                    while sending.is_set():
                        lengths = [await raw.xlen(keys.command_stream(i)) for i in range(service.command_streams)]
                        stream_peak = max(stream_peak, sum(lengths))
                        await asyncio.sleep(1.0)

                started = time.monotonic()
                runners = [asyncio.create_task(running_runner(c)) for c in running]
                runners += [asyncio.create_task(wake_runner(n)) for n in range(2)]
                watcher = asyncio.create_task(watch_streams())
                await asyncio.gather(*(sender(n) for n in range(SENDERS)))
                sent_in = time.monotonic() - started
                sending.clear()
                await asyncio.wait_for(asyncio.gather(*runners, watcher), 120)
                drained_in = time.monotonic() - started
                assert consumed == SENDS

                # ---- transient structures: back near empty once the workers' periodic trim ran ----
                command_streams = [keys.command_stream(i) for i in range(service.command_streams)]
                wake_streams = [keys.wake_stream(p) for p in range(service.partitions)]
                deadline = time.monotonic() + 10
                while sum([await raw.xlen(s) for s in command_streams + wake_streams]) > len(command_streams) + len(
                        wake_streams) and time.monotonic() < deadline:
                    await asyncio.sleep(0.2)
                transient = {
                    "command stream entries": sum([await raw.xlen(s) for s in command_streams]),
                    "commands pending": sum([(await raw.xpending(s, keys.COMMAND_GROUP))["pending"]
                                             for s in command_streams]),
                    "wake stream entries": sum([await raw.xlen(s) for s in wake_streams]),
                    "reply lists": await scan_count(raw, "tm:reply:*"),
                    "dead letters": await raw.xlen(keys.dead_letters()),
                    "approval notices": await scan_count(raw, "tm:approval-notify:*"),
                    "feed entries": sum([await raw.xlen(keys.feed(p)) for p in range(service.partitions)]),
                }
                records = [await adapters(host).sessions.record(c.session_id) for c in running + idle]
                pending_mail = sum([await raw.hlen(keys.session_mail(r.partition, r.session_id)) for r in records])
                due = sum([await raw.hlen(keys.session_due(r.partition, r.session_id)) for r in records])
                snapshots = [len(await raw.hget(keys.session_snapshot(r.partition, r.session_id), "snapshot") or b"")
                             for r in records]
                assert transient["command stream entries"] <= len(command_streams), transient
                assert transient["commands pending"] == 0, transient
                assert transient["wake stream entries"] <= len(wake_streams), transient
                assert transient["reply lists"] == 0 and transient["dead letters"] == 0, transient
                assert transient["approval notices"] == 0, transient
                # Trimmed to about FEED_MAXLEN per partition (MAXLEN ~ keeps whole nodes of about 100).
                assert transient["feed entries"] <= service.partitions * (FEED_MAXLEN + 200), transient
                assert (pending_mail, due) == (0, 0)
                assert max(snapshots) < 1024, snapshots
                assert stream_peak < SENDS // 4, stream_peak  # trimmed while the load ran, not only at the end

                # ---- what is kept per message: the session streams, and each tool call's idempotency record ----
                after = await memory(raw)
                senders = [await adapters(host).sessions.record(r.session_id) for r in roots]
                stream_bytes = sum([await raw.memory_usage(keys.session_stream(r.partition, r.session_id)) or 0
                                    for r in records + senders])
                idem_hashes = [keys.session_idempotency(r.partition, r.session_id) for r in senders]
                idem_records = sum([await raw.hlen(k) for k in idem_hashes])
                idem_each = sum([await raw.memory_usage(k) or 0 for k in idem_hashes]) / max(idem_records, 1)
            finally:
                await raw.aclose()
                await close_host(host)
    finally:
        server.cleanup()

    per_message = (after[0] - baseline[0]) / SENDS
    print(
        f"\nsoak: {SENDS:,} sends in {sent_in:.0f} s ({SENDS / sent_in:,.0f}/s), all consumed after {drained_in:.0f} s; "
        f"command streams peaked at {stream_peak:,} entries\n"
        f"memory per retained message: {per_message:,.0f} B of used_memory "
        f"({(after[1] - baseline[1]) / SENDS:,.0f} B of dataset): session streams {stream_bytes / SENDS:,.0f} B "
        f"(5 events: accepted, claimed, consumed; the sender's sent and settled), idempotency record "
        f"{idem_each:,.0f} B ({idem_records:,} kept as long as their sender), partition feeds bounded at "
        f"~{FEED_MAXLEN:,} entries each; senders waited at their per-source capacity {waited:,} times\n"
        f"transient after the soak: {transient}, pending mail {pending_mail}, due index {due}, "
        f"largest snapshot {max(snapshots)} B"
    )
    # One record per tool call: every accepted send, and every capacity refusal a sender then retried anew.
    assert idem_records == SENDS + waited
    assert per_message < 4096
