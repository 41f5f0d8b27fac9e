"""Scale-out and faults: a bounded load over a tree of a few hundred sessions, served by host runners."""

import asyncio
import collections
import random
import time

import pytest

from treemail.adapters.eventstore import EventStore
from treemail.projections.replay import rebuild
from treemail.projections.runner import ProjectionRunner
from treemail.adapters.viewstore import load_view
from treemail.projections.views import PROJECTIONS
from treemail.host import SendContext
from treemail.domain import events as ev

from .helpers import WorkerPool, accepted, build_tree, check_streams, config_for, histories, load_until
from tests.integration.conftest import adapters, close_host, connect_host

MESSAGING = {"max_pending_per_session": 20, "max_inflight_per_pair": 3}
LOAD_S = 10.0
SENDERS = 8


async def stored_views(redis, partitions):
    out = {}
    for p in partitions:
        for name in PROJECTIONS:
            view, _ = await load_view(redis, p, name)
            out[(name, p)] = dict(view)
    return out


@pytest.mark.slow
@pytest.mark.expected_duration_s(17)
async def test_bounded_load_invariants(redis_url):
    rng = random.Random(7)
    config = config_for(redis_url, decision_timeout_s=20, **MESSAGING)
    partitions = list(range(config.service.partitions))
    async with WorkerPool(redis_url, **MESSAGING) as pool:
        phases = {"begin": time.monotonic()}
        await pool.start(2)
        phases["workers up"] = time.monotonic()
        host = await connect_host(config, redis_url)
        try:
            projections = ProjectionRunner(EventStore(adapters(host).redis, config.service), config)
            await projections.start()
            tree = await build_tree(host, [20, 10], status="idle")  # 1 + 20 + 200 sessions
            assert len(tree.sessions) == 221
            # Only a session's open run may send (exact live sender): the root and the 20 in the middle send from
            # runs open all along; the 200 leaves are idle, woken by mail, and reply from their woken runs.
            always_running = tree.sessions[:21]
            for session in always_running:
                await host.start_run(session, f"run-of-{session}")
            phases["tree registered"] = time.monotonic()

            results = []
            served = collections.Counter()
            loading = asyncio.Event()
            loading.set()
            serving = asyncio.Event()
            serving.set()

            async def sender(n: int) -> None:
                local = random.Random(n)
                count = 0
                while loading.is_set():
                    me = local.choice(always_running)
                    to = local.choice(tree.neighbours[me])
                    ctx = SendContext(me, f"run-of-{me}", f"sender{n}-{count}")
                    count += 1
                    args = {"to": tree.handles[to], "body": f"#{count} from {n}",
                            "mode": local.choice(["steer", "queue"])}
                    results.append((me, ctx.run_id, ctx.tool_call_id, to, await host.send_message(ctx, args)))

            async def host_runner(n: int) -> None:
                """Serve wake triggers: start the run, claim at a couple of boundaries, acknowledge, finish."""
                runs = 0
                while serving.is_set():
                    for wake in await host.wakes(f"runner-{n}", count=10, block_ms=100):
                        run_id = f"runner{n}-run{runs}"
                        runs += 1
                        if not await host.wake_run(wake, run_id):
                            served["already_running"] += 1
                            continue
                        served["runs"] += 1
                        for _ in range(2):  # two model requests: steer mail may join the second
                            for delivery in await host.claim(wake.session_id, run_id):
                                if rng.random() < 0.9:
                                    await host.consume(wake.session_id, delivery.message_id)
                                    served["consumed"] += 1
                                elif rng.random() < 0.5:
                                    await host.discard(wake.session_id, delivery.message_id, "stale")
                                    served["discarded"] += 1
                                else:
                                    served["left_claimed"] += 1  # released by finish_run
                        # The woken run answers a neighbour before it ends, from its own live run.
                        me, to = wake.session_id, rng.choice(tree.neighbours[wake.session_id])
                        ctx = SendContext(me, run_id, f"reply-{n}-{runs}")
                        reply = await host.send_message(ctx, {"to": tree.handles[to], "body": f"reply {runs}"})
                        results.append((me, run_id, ctx.tool_call_id, to, reply))
                        await host.finish_run(wake.session_id, run_id)

            async def follow() -> None:
                while serving.is_set():
                    await projections.step(block_ms=100)

            started = time.monotonic()
            tasks = [asyncio.create_task(sender(n)) for n in range(SENDERS)]
            background = [asyncio.create_task(host_runner(n)) for n in range(2)] + [asyncio.create_task(follow())]
            await load_until(lambda: accepted(results) > 500 and served["runs"] > 50 and served["consumed"] > 500,
                             LOAD_S, what="the bounded load")
            loading.clear()
            await asyncio.gather(*tasks)
            elapsed = time.monotonic() - started
            phases["load done"] = time.monotonic()
            serving.clear()
            await asyncio.gather(*background)
            phases["runners stopped"] = time.monotonic()

            while await projections.step(block_ms=50):
                pass
            live = await stored_views(adapters(host).redis, partitions)
            rebuilt = {key: dict(view) for key, view in (await rebuild(adapters(host).store, partitions, write=False)).items()}
            phases["views compared"] = time.monotonic()
            all_histories = await histories(host, tree.sessions)
            phases["histories read"] = time.monotonic()
        finally:
            await close_host(host)
        assert [p.poll() for p in pool.started] == [None, None]

    outcomes = check_streams(all_histories, results, MESSAGING, {"send_message:inbox_full",
                                                                  "send_message:inflight_full"})
    print(f"\nbounded load: {len(results)} sends by {SENDERS} senders over {len(tree.sessions)} sessions in "
          f"{elapsed:.1f} s = {len(results) / elapsed:.0f} sends/s ({outcomes['ok'] / elapsed:.0f} accepted/s); "
          f"decisions by outcome {dict(outcomes)}; host runners {dict(served)}")
    marks = list(phases.items())
    print("phases: " + ", ".join(f"{name} +{at - marks[i][1]:.1f} s" for i, (name, at) in enumerate(marks[1:])))
    assert outcomes["ok"] > 500 and served["runs"] > 50 and served["consumed"] > 500
    # The projection views a live runner kept while the load ran equal a full rebuild from the streams.
    assert live.keys() == rebuilt.keys()
    assert [key for key in live if live[key] != rebuilt[key]] == []
    # ... and agree with the streams: the inbox view holds each session's pending agent mail.
    inbox = {f: int(v) for (name, _), view in live.items() if name == "inbox"
             for f, v in view.items() if not f.startswith("seq:")}
    pending = collections.Counter()
    for session, history in all_histories.items():
        for _, event in history:
            if getattr(event, "owner", None) == "agent":
                if isinstance(event, ev.ProducerMessageAccepted):
                    pending[session] += 1
                elif isinstance(event, ev.ProducerMessageConsumed | ev.ProducerMessageDiscarded):
                    pending[session] -= 1
    assert inbox == {s: n for s, n in pending.items() if n > 0}
    [summary] = [view for (name, _), view in live.items() if name == "trees" and any(f.endswith(":accepted") for f in view)]
    assert int(summary[f"{tree.sessions[0]}:sessions"]) == 221
