"""Reading a partition feed: which session appended which event, with the event read from its stream.

A feed entry names an appended event (session, position, type, protocol) and carries
no copy of its data: the session stream keeps the only one. The copy was a third of
what an accepted message cost in memory (BENCHMARKS.md). A reader that needs the events of
a batch reads them from their streams in one pipeline, one XRANGE per session (each
session's feed entries are consecutive positions of its stream). The partition's
streams share the feed's hash slot, so on a cluster the pipeline goes to one node.
"""

from collections.abc import Callable
from typing import NamedTuple

from redis.asyncio import Redis

from ..domain import events as ev
from ..domain import protocol
from . import keys
from .eventstore import decode_entry


class FeedEntry(NamedTuple):
    entry_id: str
    session_id: str
    seq: int
    type_name: str
    # The protocol that wrote it (`v`); a newer one than this reader's leaves the event None, never guessed at.
    version: int
    # None when not wanted, of a type this version does not know, or gone with its stream (retention).
    event: ev.Event | None

    @property
    def newer(self) -> bool:
        return protocol.is_newer(self.version)


def _text(value) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


async def resolve(redis: Redis, partition: int, entries: list, wanted: Callable[[str], bool]) -> list[FeedEntry]:
    """The raw feed entries of one partition (XREAD's), each with its event if its type is ``wanted``."""
    named = []
    ranges: dict[str, tuple[int, int]] = {}
    for entry_id, fields in entries:
        session_id, seq, type_name = _text(fields[b"session"]), int(fields[b"seq"]), _text(fields[b"type"])
        version = protocol.version_of(fields.get(b"v"))
        read_it = not protocol.is_newer(version) and wanted(type_name)
        named.append((_text(entry_id), session_id, seq, type_name, version, read_it, fields.get(b"data")))
        if read_it and b"data" not in fields:
            low, high = ranges.get(session_id, (seq, seq))
            ranges[session_id] = (min(low, seq), max(high, seq))
    read: dict[tuple[str, int], dict] = {}
    if ranges:
        async with redis.pipeline(transaction=False) as pipe:
            for session_id, (low, high) in ranges.items():
                pipe.xrange(keys.session_stream(partition, session_id), min=f"{low}-0", max=f"{high}-0")
            replies = await pipe.execute()
        for session_id, stream_entries in zip(ranges, replies):
            for stream_id, stream_fields in stream_entries:
                read[(session_id, int(stream_id.split(b"-")[0]))] = stream_fields
    out = []
    for entry_id, session_id, seq, type_name, version, read_it, data in named:
        event = None
        if not read_it:
            pass
        elif data is not None:  # written before feeds stopped carrying a copy
            event = ev.decode(type_name, data)
        elif (stored := read.get((session_id, seq))) is not None:
            event = decode_entry(stored)
        out.append(FeedEntry(entry_id, session_id, seq, type_name, version, event))
    return out
