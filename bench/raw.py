"""The raw baseline: the least a Redis-Streams command worker can do per send.

XREADGROUP COUNT 100; pipelined HMGET of each recipient's state hash; a trivial
decision; one pipelined Lua compare-and-set per command (check the version
field, XADD the event, HSET the new version); one XACK per batch.
"""

import json
import time

import redis.asyncio as aioredis

STREAM = "raw:cmd"
GROUP = "raw-workers"

CAS_LUA = """
local current = tonumber(redis.call('HGET', KEYS[2], 'version') or '0')
if current ~= tonumber(ARGV[1]) then return {'conflict', tostring(current)} end
local version = current + 1
redis.call('XADD', KEYS[1], version .. '-0', 'type', 'Accepted', 'data', ARGV[2])
redis.call('HSET', KEYS[2], 'version', version)
return {'ok', tostring(version)}
"""


def state_key(recipient: str) -> str:
    return f"raw:{{{recipient}}}:state"


def events_key(recipient: str) -> str:
    return f"raw:{{{recipient}}}:events"


async def prefill(redis: aioredis.Redis, recipients: list[str], total: int, seed_order: list[int]) -> None:
    await redis.xgroup_create(STREAM, GROUP, id="0", mkstream=True)
    chunk = 5000
    for start in range(0, total, chunk):
        async with redis.pipeline(transaction=False) as pipe:
            for i in range(start, min(total, start + chunk)):
                to = recipients[seed_order[i]]
                pipe.xadd(STREAM, {"__data__": json.dumps({"id": f"c{i}", "to": to, "body": f"benchmark message {i}"})})
            await pipe.execute()


async def run_worker(url: str, total: int, batch: int = 100) -> tuple[float, int]:
    """Decide every prefilled command; returns (seconds, commands decided)."""
    redis = aioredis.Redis.from_url(url)
    sha = await redis.script_load(CAS_LUA)
    decided = 0
    conflicts = 0
    started = None
    try:
        while decided < total:
            reply = await redis.xreadgroup(GROUP, "raw-1", {STREAM: ">"}, count=batch, block=100)
            if not reply:
                continue
            if started is None:
                started = time.perf_counter()
            entries = reply[0][1]
            pending = [(entry_id, json.loads(fields[b"__data__"])) for entry_id, fields in entries]
            while pending:
                recipients = list(dict.fromkeys(cmd["to"] for _, cmd in pending))
                async with redis.pipeline(transaction=False) as pipe:
                    for r in recipients:
                        pipe.hmget(state_key(r), "version", "snapshot")
                    states = await pipe.execute()
                versions = {r: int(s[0] or 0) for r, s in zip(recipients, states)}
                async with redis.pipeline(transaction=False) as pipe:
                    for _, cmd in pending:
                        # The trivial decision: accept, chaining versions within the batch.
                        expected = versions[cmd["to"]]
                        versions[cmd["to"]] = expected + 1
                        event = json.dumps({"message_id": cmd["id"], "body": cmd["body"]})
                        pipe.evalsha(sha, 2, events_key(cmd["to"]), state_key(cmd["to"]), expected, event)
                    results = await pipe.execute()
                retry = [p for p, r in zip(pending, results) if r[0] != b"ok"]
                conflicts += len(retry)
                pending = retry
            await redis.xack(STREAM, GROUP, *[entry_id for entry_id, _ in entries])
            decided += len(entries)
        return time.perf_counter() - started, decided
    finally:
        await redis.aclose()
