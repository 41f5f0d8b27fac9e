"""Reading the approvals index: each partition's hash of requests and their status.

The commit step writes it from the approval events, in the same atomic step;
the events on the sender's stream stay the truth.
"""

import json

from redis.asyncio import Redis

from . import keys


async def find(redis: Redis, request_id: str, partitions: int) -> dict | None:
    """The request with its current status, from whichever partition holds it."""
    async with redis.pipeline(transaction=False) as pipe:
        for p in range(partitions):
            pipe.hmget(keys.approvals(p), request_id, f"{request_id}:status")
        replies = await pipe.execute()
    for raw, status in replies:
        if raw is not None:
            return {**json.loads(raw), "status": (status or b"pending").decode()}
    return None


async def every(redis: Redis, partitions: int) -> list[dict]:
    """Every request of every partition, oldest first."""
    out = []
    for p in range(partitions):
        index = {k.decode(): v for k, v in (await redis.hgetall(keys.approvals(p))).items()}
        for field, raw in index.items():
            if not field.endswith(":status"):
                out.append({**json.loads(raw), "status": index.get(f"{field}:status", b"pending").decode()})
    return sorted(out, key=lambda r: r["at"])
