"""Subscriptions: every session's mail events for plugins, live and resumable from a position.

The source is the partition feeds: the commit step that appends a session's
events names them in its partition's feed in the same atomic call, so a
subscriber sees every event the streams hold, in each session's order (each
event read from its session stream, ``adapters.feed``).
There is no order across partitions (they are independent, possibly on
different cluster nodes).

A position says how far the subscriber got in every partition's feed: the
last entry id it read there and how many entries the feed had added up to it.
It is an opaque string. Each event comes with the
position just after it: store it, and ``subscribe(after=position)`` resumes
with the next event, none twice and none missed. A position older than what a
trimmed feed still holds (``feed_maxlen``) cannot be resumed without a gap:
that raises ``SubscriptionGap`` rather than skip events silently (the session
streams still hold them: ``tm.history``), at the start and before each read
of a subscription that fell that far behind.
"""

import asyncio
import re
from collections.abc import AsyncIterator, Callable, Collection
from dataclasses import dataclass
from typing import NamedTuple

from redis.asyncio import Redis
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import ResponseError
from redis.exceptions import TimeoutError as RedisTimeoutError

from ..domain import events as ev
from ..domain import limits
from ..domain.errors import TreemailError
from . import feed, keys
from .config import ServiceConfig

# The mail traffic plugins observe: producers and every ProducerMessage* step.
MAIL_EVENTS: frozenset[type[ev.Event]] = frozenset(
    cls for name, cls in ev.EVENT_TYPES.items() if name.startswith("ProducerMessage") or name == "ProducerRegistered"
)
START = "start"
_PART = re.compile(r"^\d+-\d+/\d+(/\d+)?$")


class SubscriptionGap(TreemailError, LookupError):
    """The feeds no longer hold every event after this position (trimmed): resuming would skip some."""

    code = "history:subscription_gap"


class Observed(NamedTuple):
    position: str
    session_id: str
    event: ev.Event


def _text(value) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


@dataclass(frozen=True)
class FeedPosition:
    """Per partition: the last feed entry id read ("0-0": none) and the feed's entry count up to it.

    The count is what makes a gap exact: trimming removed ``entries-added - length`` entries (treemail
    never deletes single entries), and a subscriber that had read fewer than that missed some.

    A feed entry names a whole step, which may append several events; a position between two of them
    says how many of the next entry's events were read (``within``, written as a third part): the id is
    then the one just before that entry, so the next read starts with it again and skips them.
    """

    entries: tuple[tuple[str, int], ...]
    within: tuple[int, ...] = ()

    def skip(self, partition: int) -> int:
        return self.within[partition] if self.within else 0

    def __str__(self) -> str:
        return ",".join(f"{entry_id}/{count}" + (f"/{self.skip(p)}" if self.skip(p) else "")
                        for p, (entry_id, count) in enumerate(self.entries))

    @classmethod
    def parse(cls, text: str, partitions: int) -> "FeedPosition":
        parts = text.split(",")
        if len(parts) != partitions or not all(_PART.match(p) for p in parts):
            raise limits.invalid(f"not a subscription position of this deployment ({partitions} partitions): "
                                 f"{limits.shown(text)}")
        split = [p.split("/") for p in parts]
        within = tuple(int(s[2]) if len(s) > 2 else 0 for s in split)
        return cls(tuple((s[0], int(s[1])) for s in split), within if any(within) else ())

    def after(self, partition: int, entry_id: str, read: int | None = None) -> "FeedPosition":
        """Past the entry ``entry_id``, or (``read``) past the first ``read`` of the events it names."""
        entries = list(self.entries)
        within = list(self.within or (0,) * len(entries))
        if read is None:
            entries[partition], within[partition] = (entry_id, entries[partition][1] + 1), 0
        else:
            entries[partition], within[partition] = (_before(entry_id), entries[partition][1]), read
        return FeedPosition(tuple(entries), tuple(within) if any(within) else ())


def _before(entry_id: str) -> str:
    """The stream id just before ``entry_id``: a read after it starts with that entry."""
    ms, seq = (int(part) for part in entry_id.split("-"))
    return f"{ms}-{seq - 1}" if seq else f"{ms - 1}-{2 ** 64 - 1}"


async def _feed_info(redis: Redis, partitions: int) -> list[dict | None]:
    async def one(p: int) -> dict | None:
        try:
            return await redis.xinfo_stream(keys.feed(p))
        except ResponseError:  # no feed yet: nothing was ever appended in this partition
            return None

    return list(await asyncio.gather(*(one(p) for p in range(partitions))))


async def starting_position(redis: Redis, partitions: int, after: str | None) -> FeedPosition:
    """None: from now on; ``START``: from the oldest event the feeds hold; else a position to resume after."""
    infos = await _feed_info(redis, partitions)
    added = [int(i["entries-added"]) if i else 0 for i in infos]
    trimmed = _trimmed(infos)
    if after == START:
        return FeedPosition(tuple(("0-0", t) for t in trimmed))
    if after is None:
        return FeedPosition(tuple(
            (_text(i["last-generated-id"]) if i else "0-0", n) for i, n in zip(infos, added)
        ))
    position = FeedPosition.parse(after, partitions)
    _require_no_gap(position, trimmed)
    return position


def _trimmed(infos: list[dict | None]) -> list[int]:
    """Per partition, how many of its feed's entries trimming removed."""
    return [int(i["entries-added"]) - int(i["length"]) if i else 0 for i in infos]


def _require_no_gap(position: FeedPosition, trimmed: list[int]) -> None:
    for p, ((_, count), gone) in enumerate(zip(position.entries, trimmed)):
        if count < gone:
            raise SubscriptionGap(
                f"partition {p}'s feed was trimmed past this position ({gone - count} events after it are gone); "
                "read the sessions' history instead, then subscribe from now"
            )


async def _read(redis: Redis, config: ServiceConfig, position: FeedPosition, count: int, block_ms: int) -> list:
    streams = {keys.feed(p): entry_id for p, (entry_id, _) in enumerate(position.entries)}
    if config.cluster:
        # One stream per read: the partitions' feeds live in different slots.
        replies = await asyncio.gather(*(
            redis.xread({stream: entry_id}, count=count, block=block_ms) for stream, entry_id in streams.items()
        ))
        return [r for reply in replies for r in reply or []]
    return await redis.xread(streams, count=count, block=block_ms) or []


async def subscribe(
    redis: Redis, config: ServiceConfig, after: str | None, types: Collection[type[ev.Event]] | None,
    stopping: Callable[[], bool], block_ms: int = 1000, count: int = 500,
) -> AsyncIterator[Observed]:
    position = await starting_position(redis, config.partitions, after)
    names = {cls.__name__ for cls in types} if types is not None else None

    def wanted(type_name: str) -> bool:
        return names is None or type_name in names

    partition_of = {keys.feed(p): p for p in range(config.partitions)}
    while not stopping():
        try:
            # A subscriber that fell behind the trim (``feed_maxlen``) is told, as at its start: read on,
            # it would go on from the oldest entry still kept and skip the rest.
            _require_no_gap(position, _trimmed(await _feed_info(redis, config.partitions)))
            batches = [
                (partition_of[_text(stream)], await feed.resolve(redis, partition_of[_text(stream)], entries, wanted))
                for stream, entries in await _read(redis, config, position, count, block_ms)
            ]
        except (RedisConnectionError, RedisTimeoutError):
            if stopping():
                return
            await asyncio.sleep(0.25)  # a server blip: the position is kept, nothing is skipped
            continue
        for partition, entries in batches:
            # Events of the first entry a position between two events of one step says were read already.
            skip, first = position.skip(partition), entries[0].entry_id if entries else None
            for entry in entries:
                if skip and entry.entry_id == first and entry.index < skip:
                    continue
                position = position.after(partition, entry.entry_id, None if entry.last else entry.index + 1)
                if entry.event is not None:
                    yield Observed(str(position), entry.session_id, entry.event)
