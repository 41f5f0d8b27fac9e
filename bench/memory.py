"""Memory per accepted message: everything treemail keeps, next to a bare XADD of the same body.

Valkey's `used_memory` is read before and after the measured sends (the worker's periodic
trim of the command stream given its chance in between), and every key's `MEMORY USAGE`
(SAMPLES 0: exact) is summed by kind of key, so the table says where the bytes are.
"""

import asyncio
import re
import time

import redis.asyncio as aioredis

from treemail.adapters import keys
from treemail.host import SendContext, Treemail

from .common import STREAM, Workers, bench_config, flush_sync, register_trees

BODY = 200
TRIM_WAIT_S = 20.0  # the worker trims every reclaim_idle_ms / 2 (7.5 s by default)


def kind_of(key: str, senders: set[str]) -> str:
    """`tm:{p3}:s:<sid>:events` -> `sender s:events`, `tm:cmd:{c0}` -> `cmd`, ..."""
    match = re.match(r"^[^:]+:\{p\d+\}:s:([^:]+):(.+)$", key)
    if match:
        return f"{'sender' if match.group(1) in senders else 'recipient'} s:{match.group(2)}"
    key = re.sub(r"^[^:]+:", "", key)
    key = re.sub(r"\{[pc]\d+\}", "{N}", key)
    return re.sub(r":t:[^:]+:", ":t:<root>:", re.sub(r"^(dir|reply|token|peers):.*$", r"\1:*", key))


async def usage_by_kind(r: aioredis.Redis, senders: set[str], classify=kind_of, match: str | None = None
                        ) -> dict[str, int]:
    """`MEMORY USAGE` (SAMPLES 0: exact) of every key (``match``: of those), summed by ``classify(name,
    senders)``; a key it classifies as None is left out."""
    out: dict[str, int] = {}
    async for key in r.scan_iter(match=match, count=1000):
        kind = classify(key.decode(), senders)
        if kind is not None:
            out[kind] = out.get(kind, 0) + (await r.memory_usage(key, samples=0) or 0)
    return out


async def used_memory(r: aioredis.Redis) -> int:
    return int((await r.info("memory"))["used_memory"])


async def bare_xadd(r: aioredis.Redis, count: int) -> float:
    """Bytes per entry of a bare `XADD s * body <200 bytes>` into one stream."""
    await r.delete("bare")
    before = await used_memory(r)
    for start in range(0, count, 1000):
        async with r.pipeline(transaction=False) as pipe:
            for i in range(start, min(count, start + 1000)):
                pipe.xadd("bare", {"body": f"{i:08d}".ljust(BODY, "x")})
            await pipe.execute()
    per_entry = (await used_memory(r) - before) / count
    await r.delete("bare")
    return per_entry


async def phase_memory(url: str, sends: int, log) -> dict:
    r = aioredis.Redis.from_url(url)
    await flush_sync(r)
    workers = Workers(url)
    host = await Treemail.connect(bench_config(url), url)
    try:
        trees = await register_trees(host, 20, 5)  # 20 senders: each stays under the source capacity
        pairs = [(root, kid) for root, kids in trees for kid in kids]
        senders = {root for root, _ in trees}
        workers.start(1)
        # One send per pair first: a pair's first message also registers its producer, a cost per pair.
        await asyncio.gather(*[host.send_message(SendContext(root, "run-1", f"w-{kid}"), {"to": kid, "body": "warm"})
                               for root, kid in pairs])
        await asyncio.sleep(0.5)
        before, kinds_before = await used_memory(r), await usage_by_kind(r, senders)
        failed = 0
        for start in range(0, sends, 50):  # 50 in flight
            results = await asyncio.gather(*[
                host.send_message(SendContext(pairs[i % len(pairs)][0], "run-1", f"m-{i}"),
                                  {"to": pairs[i % len(pairs)][1], "body": f"{i:08d}".ljust(BODY, "x")})
                for i in range(start, min(sends, start + 50))
            ])
            failed += sum("message_id" not in x for x in results)
        length_after_run = await r.xlen(STREAM)
        deadline = time.perf_counter() + TRIM_WAIT_S
        while await r.xlen(STREAM) >= length_after_run and time.perf_counter() < deadline:
            await asyncio.sleep(0.5)
        length_after_trim = await r.xlen(STREAM)
        workers.check_alive()
        after, kinds_after = await used_memory(r), await usage_by_kind(r, senders)
        reply_keys = [k async for k in r.scan_iter(match=keys.reply_list("*"))]
        bare = await bare_xadd(r, sends)
    finally:
        await host.close()
        workers.stop()
        await r.aclose()
    accepted = sends - failed
    per_kind = {k: (kinds_after.get(k, 0) - kinds_before.get(k, 0)) / accepted
                for k in sorted(set(kinds_after) | set(kinds_before))}
    per_kind = {k: round(v, 1) for k, v in sorted(per_kind.items(), key=lambda kv: -abs(kv[1])) if abs(v) >= 0.5}
    out = {"sends": sends, "accepted": accepted, "body_bytes": BODY,
           "bytes_per_message": (after - before) / accepted, "bare_xadd_bytes": bare,
           "keys_bytes_per_message": round(sum(per_kind.values()), 1), "by_kind": per_kind,
           "command_stream_len_after_run": length_after_run, "command_stream_len_after_trim": length_after_trim,
           "reply_lists_left": len(reply_keys)}
    out["ratio"] = out["bytes_per_message"] / bare
    log(f"  memory: {out['bytes_per_message']:,.0f} bytes per accepted {BODY}-byte message (used_memory), "
        f"bare XADD {bare:,.0f} bytes: x{out['ratio']:.2f}; by kind of key {per_kind}; command stream "
        f"{length_after_run} entries after the run, {length_after_trim} after the worker's trim; "
        f"reply lists left {len(reply_keys)}")
    return out
