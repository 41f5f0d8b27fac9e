"""Trimming what is transient: entries of a consumer-group stream that every reader has handled.

Command streams and wake streams are queues, not history (the session
streams are the history): once an entry is acknowledged it is never read
again. ``trim_handled`` drops every entry below the oldest one any group of
the stream still owes (pending, or not read yet), so no reader can miss an
entry or lose one it must still acknowledge or reclaim. A wake stream has
two groups (wakes, and interrupts in a group of their own): an interrupt the
wake readers passed over stays until the interrupt readers have handled it.
"""

from redis.asyncio import Redis
from redis.exceptions import ResponseError


def _text(value) -> str:
    return value.decode() if isinstance(value, bytes) else value


def _id(entry_id: str) -> tuple[int, int]:
    ms, _, seq = entry_id.partition("-")
    return int(ms), int(seq or 0)


async def trim_handled(redis: Redis, stream: str) -> int:
    """XTRIM MINID below the oldest entry any group of ``stream`` still owes. Returns entries dropped."""
    try:
        groups = await redis.xinfo_groups(stream)
    except ResponseError:
        return 0  # no such stream yet
    if not groups:
        return 0  # nobody reads it yet: everything is still owed
    keep_from = min([await _owed_from(redis, stream, info) for info in groups], key=_id)
    if _id(keep_from) == (0, 0):
        return 0
    return await redis.xtrim(stream, minid=keep_from, approximate=False)


async def _owed_from(redis: Redis, stream: str, info: dict) -> str:
    """The oldest entry one group still owes: its oldest pending one, else the first after its last read
    (kept from the last read on, which XTRIM MINID keeps)."""
    # Everything after the last delivered entry is unread; everything pending is unacknowledged.
    keep_from = _text(info["last-delivered-id"])
    if info["pending"]:
        oldest = _text((await redis.xpending(stream, _text(info["name"])))["min"])
        if oldest and _id(oldest) < _id(keep_from):
            keep_from = oldest
    return keep_from
