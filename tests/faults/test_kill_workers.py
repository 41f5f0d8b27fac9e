"""Scale-out and faults: workers killed with SIGKILL again and again while a steady load runs."""

import asyncio
import random
import time

import pytest

from treemail.host import SendContext, Treemail

from .helpers import WorkerPool, accepted, build_tree, check_streams, code, config_for, histories, load_until

MESSAGING = {"max_pending_per_session": 20, "max_inflight_per_pair": 3}
LOAD_S = 15.0


@pytest.mark.slow
@pytest.mark.expected_duration_s(21)
async def test_repeated_kill_9_of_random_workers_under_steady_load(redis_url):
    rng = random.Random(20261129)
    config = config_for(redis_url, decision_timeout_s=20, **MESSAGING)
    async with WorkerPool(redis_url, **MESSAGING) as pool:
        await pool.start(3)
        host = await Treemail.connect(config, redis_url)
        try:
            tree = await build_tree(host, [7, 6])  # 1 + 7 + 42 = 50 sessions, all running
            assert len(tree.sessions) == 50
            for session in tree.sessions:
                await host.start_run(session, "run-main")

            results = []  # (sender, run, tool_call_id, recipient, result)
            retried = 0
            latencies = []
            loading = asyncio.Event()
            loading.set()

            async def sender(n: int) -> None:
                nonlocal retried
                local = random.Random(n)
                count = 0
                accepted = []
                while loading.is_set():
                    if accepted and local.random() < 0.05:
                        # The same tool call again (a host retrying): the original answer, nothing appended.
                        ctx, args, first = local.choice(accepted)
                        again = await host.send_message(ctx, args)
                        assert again["message_id"] == first["message_id"], (again, first)
                        retried += 1
                        continue
                    me = local.choice(tree.sessions)
                    to = local.choice(tree.neighbours[me])
                    ctx = SendContext(me, "run-main", f"sender{n}-{count}")
                    args = {"to": tree.handles[to], "body": f"from sender {n}, #{count}",
                            "mode": local.choice(["steer", "queue"])}
                    count += 1
                    sent_at = time.monotonic()
                    result = await host.send_message(ctx, args)
                    latencies.append(time.monotonic() - sent_at)
                    results.append((me, "run-main", ctx.tool_call_id, to, result))
                    if "message_id" in result:
                        accepted.append((ctx, args, result))

            async def consumer() -> None:
                """Claims at the running sessions' boundaries and acknowledges, so inboxes and windows drain."""
                while loading.is_set():
                    session = rng.choice(tree.sessions)
                    for delivery in await host.claim(session, "run-main"):
                        roll = rng.random()
                        if roll < 0.7:
                            await host.consume(session, delivery.message_id)
                        elif roll < 0.85:
                            await host.discard(session, delivery.message_id, "stale")
                        else:
                            await host.release(session, delivery.message_id)
                    await asyncio.sleep(0.005)

            async def killer() -> None:
                while loading.is_set():
                    await asyncio.sleep(rng.uniform(0.5, 1.0))
                    assert pool.kill_random(rng) is not None
                    pool.spawn()

            def enough() -> bool:
                refused = sum(1 for *_, r in results if code(r) == "send_message:inflight_full")
                return len(pool.killed) >= 10 and accepted(results) > 200 and refused > 0

            started = time.monotonic()
            senders = [asyncio.create_task(sender(n)) for n in range(8)]
            consumers = [asyncio.create_task(consumer()) for _ in range(2)]
            killing = asyncio.create_task(killer())
            await load_until(enough, LOAD_S, what="kill -9 under load")
            loading.clear()
            await killing
            # The sends in flight are decided by the surviving and replacement workers.
            await asyncio.gather(*senders)
            await asyncio.gather(*consumers)
            elapsed = time.monotonic() - started
            all_histories = await histories(host, tree.sessions)
        finally:
            await host.close()

        killed = len(pool.killed)
        assert killed >= 10
        assert all(p.returncode == -9 for p in pool.killed)
        assert len(pool.live()) == 3  # replacements kept the pool at strength

    outcomes = check_streams(all_histories, results, MESSAGING, {"send_message:inbox_full",
                                                                  "send_message:inflight_full"})
    print(f"\nkill -9 under load: {len(results)} sends in {elapsed:.1f} s ({len(results) / elapsed:.0f}/s), "
          f"{killed} workers killed, {retried} idempotent retries, outcomes {dict(outcomes)}; "
          f"{sum(1 for t in latencies if t > 0.4)} sends waited > 0.4 s (reclaimed), max {max(latencies):.2f} s")
    # The load exercised what it claims to: acceptances, and refusals by both guards.
    assert outcomes["ok"] > 200
    assert outcomes["send_message:inflight_full"] > 0
    assert not [r for *_, r in results if code(r) == "send_message:engine_shutdown"]
