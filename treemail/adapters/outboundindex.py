"""Reading the outbound index (seed 004): each partition's hash of send intents and their settlements.

The commit step writes it from the sender's ``MessageSent`` / ``MessageRefused`` /
``MessageSettled`` events, in the same atomic step; those events stay the truth.
"""

import json

from redis.asyncio import Redis

from . import keys


async def find(redis: Redis, message_id: str, partitions: list[int]) -> tuple[dict, dict | None] | None:
    """(the sender's record, its settlement or None), from whichever of ``partitions`` holds it."""
    async with redis.pipeline(transaction=False) as pipe:
        for p in partitions:
            pipe.hmget(keys.outbound_index(p), message_id, f"{message_id}:settled")
        replies = await pipe.execute()
    for (raw, settled), partition in zip(replies, partitions):
        if raw is not None:
            return {**json.loads(raw), "partition": partition}, json.loads(settled) if settled else None
    return None
