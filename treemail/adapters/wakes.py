"""Wake triggers for host runners: read them in one consumer group, reclaim a dead runner's, reconcile.

A trigger is written in the same atomic step as the ``SessionWakeRequested``
event it announces; a runner starts the woken run and acknowledges it.

The same streams carry interrupt triggers (``"kind": "interrupt"``), read
in a group of their own (``interrupt_reader``): each group
acknowledges at once the entries of the other kind, so a wake runner never
sees an interrupt and an interrupt reader never sees a wake. Before it
passes over another kind's trigger, a reader makes sure that kind's group
exists (from the start of the stream): the streams are trimmed below what
every group still owes, so a trigger no reader of its kind has read yet is
kept for the first one that comes.
"""

import asyncio
import json
import logging
import time
from collections.abc import Callable
from typing import Any

from redis.asyncio import Redis
from redis.exceptions import ResponseError

from ..domain import protocol
from ..domain.triggers import Interrupt, Wake
from . import directory, keys
from .config import ServiceConfig

log = logging.getLogger("treemail.wakes")


def _text(value) -> str:
    return value.decode() if isinstance(value, bytes) else value


def wake_trigger(stream: str, entry_id: str, data: dict) -> Wake:
    return Wake(data["session_id"], data.get("message_id"), stream, entry_id)


def interrupt_trigger(stream: str, entry_id: str, data: dict) -> Interrupt:
    return Interrupt(
        data["session_id"], data["run_id"], data["interrupt_id"], data["sender_session_id"],
        data.get("reason", ""), stream, entry_id,
    )


class WakeReader:
    """Triggers of one ``kind`` read in their own consumer ``group``, each made by ``trigger``.

    ``from_start``: the group is created at the start of each stream before the first read, so a
    trigger written before any reader joined is still seen (interrupts); wake groups are created at
    connect (``EventStore.ensure_wake_groups``).
    """

    def __init__(self, redis: Redis, config: ServiceConfig, *, group: str = keys.WAKE_GROUP, kind: str = "wake",
                 trigger: Callable[[str, str, dict], Any] = wake_trigger, from_start: bool = False) -> None:
        self.redis = redis
        self.config = config
        self.group = group
        self.kind = kind
        self._trigger = trigger
        self._groups_ready = not from_start
        # The streams where the other kinds' groups are known to exist (``_keep_for_their_readers``).
        self._others_ready: set[str] = set()
        self._last_reclaim = 0.0

    def streams(self) -> list[str]:
        return [keys.wake_stream(p) for p in range(self.config.partitions)]

    async def read(self, consumer: str, count: int, block_ms: int) -> list:
        """Triggers another runner read but never acknowledged (it died) come first, once idle long enough."""
        if not self._groups_ready:
            await self._ensure_groups()
        reclaimed = await self._reclaim(consumer, count)
        if reclaimed:
            return reclaimed
        if self.config.cluster:
            # One stream per read: the partitions' streams live in different slots.
            replies = [r for reply in await asyncio.gather(*(
                self.redis.xreadgroup(self.group, consumer, {s: ">"}, count=count, block=block_ms)
                for s in self.streams()
            )) for r in reply or []]
        else:
            replies = await self.redis.xreadgroup(
                self.group, consumer, {s: ">" for s in self.streams()}, count=count, block=block_ms
            )
        return await self._mine([(stream, entry_id, fields) for stream, entries in replies or []
                                 for entry_id, fields in entries])

    async def unacknowledged(self, consumer: str, after: dict[str, str], count: int = 100) -> list:
        """What ``consumer`` read and has not acknowledged, in each stream after the entry ``after`` names
        there (all of it in a stream ``after`` does not name), in each stream's order: a follower that lost
        its connection gets again what was read for it and never reached it, and nothing it had."""
        if not self._groups_ready:
            await self._ensure_groups()
        out = []
        for stream in self.streams():
            start = after.get(stream, "0-0")
            while True:
                # An explicit id reads this consumer's own pending entries past it (never new ones).
                reply = await self.redis.xreadgroup(self.group, consumer, {stream: start}, count=count)
                entries = [(entry_id, fields) for _, got in reply or [] for entry_id, fields in got]
                if not entries:
                    break
                start = _text(entries[-1][0])
                # An entry trimmed since it was read has no fields left: nothing to start.
                out.extend(await self._mine([(stream, entry_id, fields) for entry_id, fields in entries if fields]))
                if len(entries) < count:
                    break
        return out

    async def probe(self) -> None:
        """Raises when the server cannot be reached; else makes sure every stream has this reader's group
        (recreated when a server came back without its data, as a worker recreates its own)."""
        await self.redis.ping()
        self._others_ready.clear()
        await self._ensure_groups()

    async def _mine(self, entries: list) -> list:
        """The triggers of this reader's kind; the others are acknowledged in this group and dropped."""
        mine, others = [], {}
        for stream, entry_id, fields in entries:
            version = protocol.version_of(fields.get(b"v"))
            if protocol.is_newer(version):
                # Left pending, unacknowledged, for a newer runner to reclaim: starting a run on what
                # this version may misread would be worse.
                log.warning("trigger %s: %s; left for a newer runner", _text(entry_id),
                            protocol.NewerProtocol(version, "it"))
                continue
            data = json.loads(fields[b"data"])
            if data.get("kind", "wake") == self.kind:
                mine.append(self._trigger(_text(stream), _text(entry_id), data))
            else:
                others.setdefault(_text(stream), []).append(entry_id)
        for stream, ids in others.items():
            await self._keep_for_their_readers(stream)
            await self.redis.xack(stream, self.group, *ids)
        return mine

    async def _keep_for_their_readers(self, stream: str) -> None:
        """Every other kind's group exists on ``stream`` before this group passes over its triggers: the trim
        then keeps them until a reader of their kind has handled them, even one that has not joined yet."""
        if stream in self._others_ready:
            return
        for kind, group in keys.TRIGGER_GROUPS.items():
            if kind != self.kind:
                await _create_group(self.redis, stream, group)
        self._others_ready.add(stream)

    async def _ensure_groups(self) -> None:
        for stream in self.streams():
            await _create_group(self.redis, stream, self.group)
        self._groups_ready = True

    async def _reclaim(self, consumer: str, count: int) -> list:
        now = time.monotonic()
        if now - self._last_reclaim < self.config.reclaim_idle_ms / 1000:
            return []
        self._last_reclaim = now
        out = []
        for stream in self.streams():
            _, entries, *_ = await self.redis.xautoclaim(
                stream, self.group, consumer, self.config.reclaim_idle_ms, count=count
            )
            out.extend(await self._mine([(stream, entry_id, fields) for entry_id, fields in entries if fields]))
        return out

    async def ack(self, wake) -> None:
        await self.redis.xack(wake.stream, self.group, wake.entry_id)

    async def sessions(self, partition: int) -> list[str]:
        return await directory.registered(self.redis, partition)



async def _create_group(redis: Redis, stream: str, group: str) -> None:
    """``group`` on ``stream``, reading from its start, unless it exists."""
    try:
        await redis.xgroup_create(stream, group, id="0", mkstream=True)
    except ResponseError as exc:
        if "BUSYGROUP" not in str(exc):
            raise


def interrupt_reader(redis, config: ServiceConfig) -> WakeReader:
    """Interrupt triggers, in their own group created from the start of each stream: an interrupt
    written before any runner read one is still seen."""
    return WakeReader(redis, config, group=keys.INTERRUPT_GROUP, kind="interrupt", trigger=interrupt_trigger,
                      from_start=True)
