"""The directory: session id -> origin record, and each tree's handles and members.

Directory entries and handles never change after registration, so caching
them cannot make a decision wrong; it only saves a round trip.
"""

import dataclasses
import json
from importlib import resources

from redis.asyncio import Redis

from ..domain.records import Peer, SessionRecord
from . import keys

CACHE_LIMIT = 100_000
PEERS_LUA = resources.files(__package__).joinpath("peers.lua").read_text()


async def registered(redis: Redis, partition: int) -> list[str]:
    """Every session registered in ``partition``, sorted (time-ordered ids: oldest first)."""
    return sorted(_text(member) for member in await redis.smembers(keys.partition_sessions(partition)))


async def registered_slice(redis: Redis, partition: int, cursor: int, count: int) -> tuple[int, list[str]]:
    """About ``count`` sessions registered in ``partition`` from SSCAN's ``cursor``, sorted, and the cursor that
    goes on (0: the set is read). Every member there from the first slice to the last is read at least once
    (a set that grows meanwhile may hand one out twice); one added or removed meanwhile may be missed."""
    cursor, members = await redis.sscan(keys.partition_sessions(partition), cursor, count=count)
    return cursor, sorted({_text(member) for member in members})


class Directory:
    def __init__(self, redis: Redis) -> None:
        self.redis = redis
        self._records: dict[str, SessionRecord] = {}
        self._handles: dict[tuple[int, str, str], str] = {}

    async def put(self, record: SessionRecord) -> None:
        await self.redis.set(keys.directory(record.session_id), record.to_json())

    async def withdraw(self, session_id: str) -> None:
        """The entry of a registration that was refused after it was written: no stream ever names it."""
        self._records.pop(session_id, None)
        await self.redis.delete(keys.directory(session_id))

    async def many(self, session_ids: list[str]) -> dict[str, SessionRecord | None]:
        found: dict[str, SessionRecord | None] = {}
        missing = []
        for sid in session_ids:
            if sid in self._records:
                found[sid] = self._records[sid]
            elif sid not in found:
                missing.append(sid)
                found[sid] = None
        if missing:
            # GETs in a pipeline, not MGET: directory keys live in every slot of a cluster.
            async with self.redis.pipeline(transaction=False) as pipe:
                for sid in missing:
                    pipe.get(keys.directory(sid))
                values = await pipe.execute()
            for sid, value in zip(missing, values):
                if value is not None:
                    record = SessionRecord.from_json(value)
                    self._cache(record)
                    found[sid] = record
        return found

    async def get(self, session_id: str) -> SessionRecord | None:
        return (await self.many([session_id]))[session_id]

    def _cache(self, record: SessionRecord) -> None:
        if len(self._records) > CACHE_LIMIT:
            self._records.clear()
            self._handles.clear()
        self._records[record.session_id] = record

    async def handle_owners(self, lookups: list[tuple[int, str, str]]) -> dict[tuple[int, str, str], str | None]:
        """(partition, root, handle) -> session id, in one round trip."""
        found: dict[tuple[int, str, str], str | None] = {k: self._handles[k] for k in lookups if k in self._handles}
        missing = list(dict.fromkeys(key for key in lookups if key not in found))
        if missing:
            async with self.redis.pipeline(transaction=False) as pipe:
                for partition, root, handle in missing:
                    pipe.hget(keys.tree_handles(partition, root), handle)
                values = await pipe.execute()
            for key, value in zip(missing, values):
                found[key] = value.decode() if value is not None else None
                if value is not None:
                    self._handles[key] = found[key]
        return found

    async def tree_members(self, partition: int, root_session_id: str) -> list[str]:
        members = await self.redis.smembers(keys.tree_members(partition, root_session_id))
        return sorted(m.decode() for m in members)

    async def tree_peers(self, sender: SessionRecord) -> list[Peer]:
        """Every other member of the sender's tree with its status, in one round trip (a read-only script).

        EVAL, not EVALSHA: this runs only on the unknown-reference error path,
        and the server caches the compiled script by its hash anyway.
        """
        prefix, events_suffix, state_suffix = keys.session_prefix(sender.partition)
        flat = await self.redis.eval(
            PEERS_LUA, 1, keys.tree_members(sender.partition, sender.root_session_id),
            prefix, events_suffix, state_suffix, sender.session_id,
        )
        peers = []
        for index in range(0, len(flat), 3):
            data, status = flat[index + 1], flat[index + 2]
            if not data:
                continue  # registered in the directory, not (yet) on its stream: not addressable
            peers.append(Peer(_record_of(json.loads(data), sender.partition), _text(status) or "unknown"))
        return peers


def _text(value) -> str:
    return value.decode() if isinstance(value, bytes) else value


def _record_of(registration: dict, partition: int) -> SessionRecord:
    """The directory record a SessionRegistered event describes (the event carries every origin field)."""
    fields = {f.name for f in dataclasses.fields(SessionRecord)} - {"partition"}
    data = {k: v for k, v in registration.items() if k in fields}
    data["rules"] = [tuple(rule) for rule in data.get("rules", [])]
    data["interrupt_rules"] = [tuple(rule) for rule in data.get("interrupt_rules", [])]
    return SessionRecord(**data, partition=partition)
