"""Phase 1b: a worker's CPU per decision without its I/O, stage by stage.

The first row's worker spends its CPU on two things: deciding (reading the command, the guards, the events,
the commit plan, the script's arguments) and talking to Valkey and FastStream (reading the batch, sending
the appends, reading their replies, answering). This phase times the first alone, in the benchmark process,
on the states a held-first round decides on: the same trees and backlog shape as the first row, each batch of
100 commands parsed, resolved (the directory, cached after the first batch), decided, planned and laid out
as the commit script's arguments, chained through the batch as a round chains them; nothing is sent.

It says how much of the worker's CPU per decision is the decision's own: a worker cannot cost less per
decision than this, whatever its I/O costs, so it is the part of the gap to the records' floor that only a
cheaper decision can close.
"""

import asyncio
import contextlib
import gc
import json
import random
import time

import redis.asyncio as aioredis

from treemail.adapters.codec import parse_command
from treemail.adapters.config import load_config
from treemail.adapters.eventstore import EventStore, SendReads
from treemail.consumers.app import settle_heap
from treemail.domain.decide import idempotency
from treemail.domain.decide.send import outcome_of
from treemail.domain.protocol import PROTOCOL_VERSION
from treemail.host import SendContext, Treemail
from treemail.services.sends import SendService, _Work

from .common import Workers, bench_config, flush, register_trees, worker_env

BATCH = 100
STAGES = ("parse", "decide", "plan and lay out")


class _Discard:
    """Where the laid-out script calls go: nowhere (``EventStore.commit_call`` adds each to it)."""

    def execute_command(self, *args) -> None:
        pass


def _commands(pairs: list[tuple[str, str]], count: int) -> list[bytes]:
    """Command stream entries as a host writes them (the codec's wire form), each to a random pair."""
    rng = random.Random(42)
    out = []
    for i in range(count):
        sender, recipient = pairs[rng.randrange(len(pairs))]
        out.append(json.dumps({"v": PROTOCOL_VERSION, "id": f"cmd-{i:08d}", "ctx": [sender, "run-1", f"call-{i}"],
                               "args": [recipient, f"benchmark message {i}", "steer"], "reply_to": f"r-{i % 50}"}
                              ).encode())
    return out


async def _held_reads(service: SendService, entries: list[bytes]) -> SendReads:
    """Every session's state as one fresh read gives it, for the whole backlog."""
    work = [_Work(parse_command(entry)) for entry in entries]
    await service._resolve(work)
    return await service._load(work)


async def _decide_all(service: SendService, store: EventStore, entries: list[bytes], reads: SendReads
                      ) -> dict[str, float]:
    """Seconds of this process's CPU per stage, deciding ``entries`` in batches as a held-first round does."""
    spent = dict.fromkeys(STAGES, 0.0)
    loaded = dict(reads.loaded)
    held = SendReads(loaded, {}, reads.tree_grants, False)
    sink = _Discard()
    clock = time.process_time
    for start in range(0, len(entries), BATCH):
        t0 = clock()
        commands = [parse_command(entry) for entry in entries[start:start + BATCH]]
        work = [_Work(command, idempotency.key_digest(command.context)) for command in commands]
        t1 = clock()
        await service._resolve(work)  # the directory's cache: no round trip after the first batch
        t2 = clock()
        decisions = [service._decide_one(w, held) for w in work]
        t3 = clock()
        for w, decision in zip(work, decisions):
            store.commit_call(service._prepare(w, decision, outcome_of(decision), loaded, False), sink)
        t4 = clock()
        spent["parse"] += t1 - t0
        spent["decide"] += (t2 - t1) + (t3 - t2)
        spent["plan and lay out"] += t4 - t3
    return spent


@contextlib.contextmanager
def settled_heap():
    """The heap as a worker settles it once started (``consumers.app.settle_heap``), for the passes only: a
    decision here then pays the collections a worker pays, not those of the benchmark's own start-up."""
    thresholds = gc.get_threshold()
    gc.collect()
    settle_heap()
    try:
        yield
    finally:
        gc.unfreeze()
        gc.set_threshold(*thresholds)


async def phase_decision(url: str, trees: int, children: int, commands: int, log, rounds: int = 5) -> dict:
    """The best of ``rounds`` passes over ``commands`` commands: microseconds per decision, by stage."""
    await flush(url)
    host = await Treemail.connect(bench_config(url), url)
    workers = Workers(url)
    redis = aioredis.Redis.from_url(url)
    try:
        pairs = [(root, kid) for root, kids in await register_trees(host, trees, children) for kid in kids]
        workers.start(1)
        # One accepted send per pair first: the producers are registered, as they are after the first batches.
        await asyncio.gather(*[host.send_message(SendContext(root, "run-1", f"warm-{kid}"), {"to": kid, "body": "warm"})
                               for root, kid in pairs])
        workers.stop()
        config = load_config(environ=worker_env(url))
        store = EventStore(redis, config.service)
        service = SendService(store, config.messaging)
        entries = _commands(pairs, commands)
        reads = await _held_reads(service, entries)
        with settled_heap():
            passes = [await _decide_all(service, store, entries, reads) for _ in range(rounds)]
    finally:
        workers.stop()
        await host.close()
        await redis.aclose()
    best = min(passes, key=lambda spent: sum(spent.values()))
    per_stage = {stage: best[stage] / commands * 1e6 for stage in STAGES}
    out = {"commands": commands, "rounds": rounds, "us_per_decision": sum(per_stage.values()),
           "us_by_stage": per_stage,
           "all_us_per_decision": [sum(p.values()) / commands * 1e6 for p in passes]}
    log(f"  deciding alone: {out['us_per_decision']:.0f} us per decision (" + ", ".join(
        f"{stage} {us:.0f}" for stage, us in per_stage.items()) + ")")
    return out
