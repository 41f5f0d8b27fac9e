"""Faults: continuable children disposed and resumed again and again while siblings send to them, with worker
processes and disposing host processes killed by SIGKILL throughout. Every acknowledged send ends: consumed,
or discarded on its recipient with its reason (a returned message with the id of the one notice its sender
got). None is left waiting for an incarnation after the last, and the pump reports nothing stranded."""

import asyncio
import collections
import random
import re
import signal

import pytest

from tests.integration.conftest import live
from treemail.adapters.connection import connect
from treemail.adapters.eventstore import EventStore
from treemail.consumers.pump import Pump
from treemail.domain import events as ev
from treemail.domain.errors import LifecycleError
from treemail.host import SendContext, Treemail

from .helpers import WorkerPool, accepted, code, config_for, load_until
from .hostkill import run_host

MESSAGING = {"max_pending_per_session": 100000, "max_inflight_per_pair": 0}
TARGETS = 4
SENDERS = 8
SENDS = 2000
LOAD_S = 10.0
RETURNED = re.compile(r"returned to its sender as notice (\S+)$")


@pytest.mark.slow
@pytest.mark.expected_duration_s(40)
async def test_dispose_racing_sends_under_worker_and_host_kill_9_leaves_no_message_without_an_end(redis_url):
    rng = random.Random(20261206)
    config = config_for(redis_url, **MESSAGING)
    async with WorkerPool(redis_url, **MESSAGING) as pool:
        await pool.start(3)
        tm = await Treemail.connect(config, redis_url)
        try:
            root = await tm.register_root("planner", "root", rules={"child": "allow"}, status="running")
            targets = [await tm.register_child(root.session_id, "target", "disposed and resumed", status="idle")
                       for _ in range(TARGETS)]
            senders = [await tm.register_child(root.session_id, "sender", "sends", rules={"sibling": "allow"},
                                               status="running") for _ in range(SENDERS)]
            await live(tm, *senders)

            results = []  # (sender, run, tool call, recipient, result)
            loading = asyncio.Event()
            loading.set()
            kills = collections.Counter()
            disposals = collections.Counter()

            async def send(n: int, sender) -> None:
                local = random.Random(n)
                count = 0
                while loading.is_set():
                    target = local.choice(targets)
                    ctx = SendContext(sender.session_id, "run-1", f"call-{count}")
                    result = await tm.send_message(ctx, {"to": target.handle, "body": f"{n} #{count}",
                                                         "mode": local.choice(["steer", "queue"])})
                    results.append((sender.session_id, "run-1", ctx.tool_call_id, target.session_id, result))
                    count += 1

            async def run_targets() -> None:
                """The targets' host: answers their mail with a run that claims and consumes what is due,
                whenever a target is open; a disposal cuts it short wherever it is."""
                runs = 0
                while loading.is_set():
                    target = rng.choice(targets).session_id
                    run = f"run-{runs}"
                    runs += 1
                    try:
                        await tm.start_run(target, run)
                        for delivery in await tm.claim(target, run):
                            await tm.consume(target, delivery.message_id)
                        await tm.finish_run(target, run)
                    except LifecycleError:
                        pass
                    await asyncio.sleep(0.05)

            async def dispose() -> None:
                """Ordinary disposals (each child stays resumable), often, racing the sends and the runs."""
                while loading.is_set():
                    await tm.disposal.dispose(rng.choice(targets).session_id, "aborted")
                    disposals["done"] += 1
                    await asyncio.sleep(rng.uniform(0.01, 0.1))

            async def dispose_and_die() -> None:
                """Disposals in a host process killed part-way: a later disposal completes each."""
                while loading.is_set():
                    target = rng.choice(targets).session_id
                    if await run_host(redis_url, "dispose", target, "-", rng.randint(0, 4)) == -signal.SIGKILL:
                        kills["host"] += 1
                    disposals["done"] += 1

            async def kill_workers() -> None:
                while loading.is_set():
                    await asyncio.sleep(rng.uniform(0.5, 1.0))
                    assert pool.kill_random(rng) is not None
                    kills["worker"] += 1
                    pool.spawn()

            def enough() -> bool:
                return len(results) >= SENDS and kills["worker"] >= 5 and kills["host"] >= 4

            tasks = [asyncio.create_task(send(n, s)) for n, s in enumerate(senders)]
            tasks += [asyncio.create_task(f()) for f in (run_targets, dispose, dispose_and_die, dispose_and_die,
                                                         kill_workers)]
            loaded_s = await load_until(enough, LOAD_S, what="dispose racing sends under kill -9")
            loading.clear()
            await asyncio.gather(*tasks)

            # The end of the delegation: each child is disposed once more with nothing racing it. That completes
            # a disposal a kill interrupted, whose close resumes the child for the mail sent while it closed; so
            # the child is disposed again until it stays closed, which returns that mail.
            final = collections.Counter()
            for target in targets:
                for _ in range(3):
                    await tm.disposal.dispose(target.session_id, "completed")
                    final[target.session_id] += 1
                    if not await tm.obligations.pending_mail(target.session_id):
                        break
            redis = await connect(redis_url, config.service)
            try:
                pump = Pump(EventStore(redis, config.service), config)
                await pump.store.load_scripts()
                reported = await pump.run_pass()  # its first pass looks for stranded mail too
            finally:
                await redis.aclose()
            stories = {s.session_id: [e for _, e in await tm.history(s.session_id)] for s in (*targets, *senders)}
        finally:
            await tm.close()

    outcomes = collections.Counter("ok" if "message_id" in r else code(r) for *_, r in results)
    assert set(outcomes) <= {"ok"}, outcomes  # a continuable child takes every send, closing or closed
    ok = {r["message_id"]: target for *_, target, r in results if "message_id" in r}
    consumed, discarded = set(), {}
    for target in targets:
        for event in stories[target.session_id]:
            if isinstance(event, ev.ProducerMessageConsumed):
                consumed.add(event.message_id)
            elif isinstance(event, ev.ProducerMessageDiscarded):
                discarded[event.message_id] = event.reason
    notices = collections.Counter(RETURNED.search(reason).group(1) for reason in discarded.values()
                                  if RETURNED.search(reason))
    sent_back = {e.message_id for s in senders for e in stories[s.session_id]
                 if isinstance(e, ev.ProducerMessageAccepted) and e.owner == "returned"}
    without_end = set(ok) - consumed - set(discarded)
    print(f"\ndispose racing sends, {loaded_s:.0f} s: {len(results)} sends ({accepted(results)} acknowledged), "
          f"{disposals['done']} disposals, {kills['host']} hosts and {kills['worker']} workers killed; "
          f"{len(consumed & set(ok))} consumed, {len(set(discarded) & set(ok))} returned or set aside, "
          f"{len(without_end)} without an end")
    assert len(without_end) == 0, sorted(without_end)[:10]
    assert max(final.values()) < 3, final  # a disposal with nothing racing it leaves nothing pending
    assert not consumed & set(discarded)
    # Returned with one notice each, on its sender's stream, and no notice for a message not returned.
    assert set(notices) == sent_back and max(notices.values(), default=1) == 1
    assert not [e for e in reported if isinstance(e, ev.ProducerMessageStranded)]
    assert kills["host"] >= 4 and kills["worker"] >= 5 and accepted(results) >= SENDS * 0.9
