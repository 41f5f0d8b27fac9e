"""Trimming what is transient: entries of a consumer-group stream that every reader has handled.

Command streams and wake streams are queues, not history (the session
streams are the history): once an entry is acknowledged it is never read
again. ``trim_handled`` drops every entry below the group's oldest pending
one, and never one the group has not read yet, so no reader can miss an
entry or lose one it must still acknowledge or reclaim.
"""

from redis.asyncio import Redis
from redis.exceptions import ResponseError


def _text(value) -> str:
    return value.decode() if isinstance(value, bytes) else value


def _id(entry_id: str) -> tuple[int, int]:
    ms, _, seq = entry_id.partition("-")
    return int(ms), int(seq or 0)


async def trim_handled(redis: Redis, stream: str, group: str) -> int:
    """XTRIM MINID below the oldest entry ``group`` still owes (pending, or not yet read). Returns entries dropped."""
    try:
        groups = await redis.xinfo_groups(stream)
    except ResponseError:
        return 0  # no such stream yet
    info = next((g for g in groups if _text(g["name"]) == group), None)
    if info is None:
        return 0  # nobody reads it yet: everything is still owed
    # Everything after the last delivered entry is unread; everything pending is unacknowledged.
    keep_from = _text(info["last-delivered-id"])
    if info["pending"]:
        oldest = _text((await redis.xpending(stream, group))["min"])
        if oldest and _id(oldest) < _id(keep_from):
            keep_from = oldest
    if _id(keep_from) == (0, 0):
        return 0
    return await redis.xtrim(stream, minid=keep_from, approximate=False)
