"""A million sends later: what treemail kept, and what it let go.

One worker decides ``sends`` SendMessage commands. A producer feeds them in chunks, keeping at most
``BACKLOG`` undecided, and a reader takes the answers off the reply list as a host does. Afterwards,
once the worker's periodic pass (every ``reclaim_idle_ms / 2``) had its chance, the queues are
measured (command stream, reply lists, wake streams), and every key's ``MEMORY USAGE`` is summed by
kind of key: per send, what remains should be the session streams, the bounded partition feed, and
the records each message keeps (its pending mail item until processed, the sender's idempotency and
outbound entries).
"""

import asyncio
import json
import random
import time

import redis.asyncio as aioredis

from treemail.adapters import keys
from treemail.adapters.codec import encode_command
from treemail.domain.commands import SendArguments, SendContext, SendMessage
from treemail.host import Treemail

from .common import MAX_OUTSTANDING, STREAM, Workers, bench_config, flush_sync, register_trees
from .memory import usage_by_kind, used_memory

BACKLOG = 50_000
CHUNK = 10_000
CLIENT = "million-client"
TRIM_WAIT_S = 20.0


def command(i: int, root: str, child: str) -> str:
    return encode_command(SendMessage(
        f"cmd-{i}", SendContext(root, "run-1", f"call-{i}"),
        SendArguments(child, f"benchmark message {i}: please look at item {i}", "steer"), CLIENT,
    ))


async def phase_million(url: str, sends: int, log) -> dict:
    r = aioredis.Redis.from_url(url)
    await flush_sync(r)
    workers = Workers(url)
    host = await Treemail.connect(bench_config(url), url)
    answers: dict[str, int] = {}
    try:
        # Nobody consumes: each sender's unsettled count only grows, so enough senders that none is full.
        trees = await register_trees(host, sends // (MAX_OUTSTANDING - 100) + 1, 1)
        senders = {root for root, _ in trees}
        before, kinds_before = await used_memory(r), await usage_by_kind(r, senders)
        workers.start(1)
        rng = random.Random(7)
        started = time.perf_counter()
        read = 0

        async def take_answers() -> None:
            nonlocal read
            while read < sends:
                got = await r.blpop([keys.reply_list(CLIENT)], timeout=1)
                batch = [got[1]] + (await r.lpop(keys.reply_list(CLIENT), 999) or []) if got else []
                for raw in batch:
                    answer = json.loads(raw)
                    kind = "ok" if "ok" in answer else answer.get("error", {}).get("code", "other")
                    answers[kind] = answers.get(kind, 0) + 1
                read += len(batch)
                workers.check_alive()

        reader = asyncio.create_task(take_answers())
        sent, peak = 0, 0
        while sent < sends:
            if reader.done():
                await reader  # it stopped early: its error (a worker that died) ends the phase
            if sent - read >= BACKLOG:
                await asyncio.sleep(0.05)
                continue
            peak = max(peak, await r.xlen(STREAM))
            async with r.pipeline(transaction=False) as pipe:
                for i in range(sent, min(sends, sent + CHUNK)):
                    root, kids = trees[i % len(trees)]
                    pipe.xadd(STREAM, {"__data__": command(i, root, kids[rng.randrange(len(kids))])})
                await pipe.execute()
            sent = min(sends, sent + CHUNK)
        await asyncio.wait_for(reader, timeout=600)
        seconds = time.perf_counter() - started
        deadline = time.perf_counter() + TRIM_WAIT_S
        while await r.xlen(STREAM) > 1 and time.perf_counter() < deadline:
            await asyncio.sleep(0.5)
        workers.check_alive()
        command_entries = await r.xlen(STREAM)
        wake_entries = sum([await r.xlen(keys.wake_stream(p)) for p in range(bench_config(url).service.partitions)])
        reply_lists = [k async for k in r.scan_iter(match=keys.reply_list("*"))]
        after, kinds_after = await used_memory(r), await usage_by_kind(r, senders)
    finally:
        await host.close()
        workers.stop()
        await r.aclose()
    per_kind = {k: (kinds_after.get(k, 0) - kinds_before.get(k, 0)) / sends
                for k in set(kinds_after) | set(kinds_before)}
    per_kind = {k: round(v, 1) for k, v in sorted(per_kind.items(), key=lambda kv: -abs(kv[1])) if abs(v) >= 0.5}
    out = {"sends": sends, "seconds": seconds, "answers": answers, "command_stream_peak": peak,
           "command_stream_after": command_entries, "wake_entries_after": wake_entries,
           "reply_lists_left": len(reply_lists), "bytes_per_send": (after - before) / sends, "by_kind": per_kind}
    log(f"  {sends:,} sends in {seconds:.0f} s ({sends / seconds:,.0f}/s), answers {answers}; command stream at "
        f"most {peak:,} entries while fed, {command_entries} after the worker's trim; wake entries {wake_entries}; "
        f"reply lists left {len(reply_lists)}; {out['bytes_per_send']:,.0f} bytes per send, by kind {per_kind}")
    return out
