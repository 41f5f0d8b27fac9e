"""The peer due index: which sources have peer deliveries a driver must look at, and when.

A sorted set per partition (source session id -> time), in the partition's
slot. A send adds its source before and after committing the intent; a
driver reschedules or removes a source only if the source's stream is still
at the position the driver decided on (one script, one slot), so an intent
committed meanwhile is never dropped from the index: either the driver saw
it, or its stream moved and the driver's write is skipped, or the send's
second add puts the source back. A driver's first pass (``sweep``) finds
every source with rows whatever the index holds.
"""

from redis.asyncio import Redis

from ..domain.records import SessionRecord
from . import keys

# KEYS: the source's state hash, the partition's peer due index. ARGV: the stream position the
# decision read, the source id, the new score ('' removes it).
_RESCHEDULE = """
if (redis.call('HGET', KEYS[1], 'version') or '0') ~= ARGV[1] then return 0 end
if ARGV[3] == '' then redis.call('ZREM', KEYS[2], ARGV[2]) else redis.call('ZADD', KEYS[2], ARGV[3], ARGV[2]) end
return 1
"""


class PeerDue:
    def __init__(self, redis: Redis) -> None:
        self.redis = redis

    async def touch(self, source: SessionRecord, at: float) -> None:
        """Due at ``at`` or sooner (LT adds a source not in the index yet)."""
        await self.redis.zadd(keys.peer_due(source.partition), {source.session_id: at}, lt=True)

    async def reschedule(self, source: SessionRecord, version: int, at: float | None) -> bool:
        """Due at exactly ``at`` (None: not due), if the source's stream is still at ``version``."""
        applied = await self.redis.eval(
            _RESCHEDULE, 2, keys.session_snapshot(source.partition, source.session_id), keys.peer_due(source.partition),
            str(version), source.session_id, "" if at is None else repr(at),
        )
        return bool(applied)

    async def due(self, partition: int, now: float, limit: int) -> list[str]:
        members = await self.redis.zrangebyscore(keys.peer_due(partition), "-inf", now, start=0, num=limit)
        return [m.decode() if isinstance(m, bytes) else m for m in members]
