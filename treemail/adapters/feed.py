"""Reading a partition feed: which session appended which event, with the event read from its stream.

A feed entry names one commit step: each session the step appended to, with the positions it
appended there (``commit.lua``), and the protocol that wrote it. It carries no copy of the events
nor their types: the session streams keep the only copy. A reader reads the events of a batch from
their streams in one pipeline, one XRANGE per session (a session's positions in the feed are
consecutive positions of its stream). The partition's streams share the feed's hash slot, so on a
cluster the pipeline goes to one node.

Entries an earlier version wrote name one event each (session, position, type; some a copy of its
data): they read as they always did.
"""

from collections.abc import Callable
from typing import NamedTuple

from redis.asyncio import Redis

from ..domain import events as ev
from ..domain import protocol
from . import compact, keys
from .eventstore import decode_entry


class FeedEntry(NamedTuple):
    entry_id: str
    session_id: str
    seq: int
    # '' when neither the entry nor the stream (gone: retention) says.
    type_name: str
    # The protocol that wrote it (`v`); a newer one than this reader's leaves the event None, never guessed at.
    version: int
    # None when not wanted, of a type this version does not know, or gone with its stream (retention).
    event: ev.Event | None
    # Its place among the events its feed entry names (an entry names a whole step), and whether it is the last.
    index: int = 0
    last: bool = True

    @property
    def newer(self) -> bool:
        return protocol.is_newer(self.version)


def _text(value) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _positions(text: str) -> range:
    """"7" -> 7; "7-9" -> 7, 8, 9 (a step's positions on one session)."""
    first, _, last = text.partition("-")
    return range(int(first), int(last or first) + 1)


def _named(fields: dict) -> list[tuple[str, int, str]]:
    """(session, position, type) of each event a feed entry names; the type '' where the entry does not say
    (the session stream does)."""
    if b"session" in fields:  # an earlier version's entry: one event
        return [(_text(fields[b"session"]), int(fields[b"seq"]), _text(fields[b"type"]))]
    return [(compact.id_from_bytes(name), seq, "") for name, value in fields.items() if name != b"v"
            for seq in _positions(_text(value))]


async def resolve(redis: Redis, partition: int, entries: list, wanted: Callable[[str], bool]) -> list[FeedEntry]:
    """The raw feed entries of one partition (XREAD's), one ``FeedEntry`` per event they name, each with its
    event if its type is ``wanted``. An entry of a newer protocol is one ``FeedEntry`` without a session: its
    form may be one this reader does not know."""
    named = []
    ranges: dict[str, tuple[int, int]] = {}
    for entry_id, fields in entries:
        version = protocol.version_of(fields.get(b"v"))
        if protocol.is_newer(version) and b"session" not in fields:
            named.append((_text(entry_id), "", 0, "", version, False, None, 0, True))
            continue
        events = _named(fields)
        for index, (session_id, seq, type_name) in enumerate(events):
            read_it = not protocol.is_newer(version) and (not type_name or wanted(type_name))
            named.append((_text(entry_id), session_id, seq, type_name, version, read_it, fields.get(b"data"),
                          index, index == len(events) - 1))
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
    for entry_id, session_id, seq, type_name, version, read_it, data, index, last in named:
        event = None
        if not read_it:
            pass
        elif data is not None:  # written before feeds stopped carrying a copy
            event = ev.decode(type_name, data)
        elif (stored := read.get((session_id, seq))) is not None:
            type_name = type_name or _text(stored[b"type"])
            if wanted(type_name):
                event = decode_entry(stored)
        out.append(FeedEntry(entry_id, session_id, seq, type_name, version, event, index, last))
    return out
