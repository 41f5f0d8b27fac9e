"""What `treemail timeline` and `treemail ui` read: the sessions and their delegation trees, the histories
a timeline or a causal chain folds (``timeline.py``), and the obligations still open. Reads only.

Sessions are found from each partition's session set and the directory, not from a projection view, so
the page shows a tree as soon as its root registers, whether or not a projection worker runs.
"""

from collections import OrderedDict
from collections.abc import Awaitable, Callable
from typing import NamedTuple

from treemail.adapters import directory, keys
from treemail.adapters.eventstore import EventStore
from treemail.domain.errors import UnknownSessionError

from . import timeline as tl

# How many sessions a page lists by default: the newest, by id (ids are time-ordered), which are the ones a
# person debugging agents looks for; it says how many older ones it leaves out (``Listing.not_listed``).
MAX_SESSIONS = 2000
# What a ``HistoryCache`` keeps over all its sessions, in bytes of memory (estimated per event, ``event_bytes``);
# the least recently read sessions are let go first. A count of events bounded nothing with large bodies: 500,000
# events of 32 KB bodies are 16 GB.
DEFAULT_HISTORY_CACHE_BYTES = 256 * 2**20
# A decoded event's memory beyond its text: the object, its fields and the (position, event) pair. Measured with
# tracemalloc: about 1,770 bytes for an accepted message, 1,180 for a claim (``make bench``'s history-cache
# phase reports the estimate against what the cache really holds).
EVENT_OVERHEAD_BYTES = 1500

Read = Callable[[str], Awaitable[tl.History]]


# How deep the trees nest a session under its root; one deeper heads a tree of its own (``trees``).
MAX_DEPTH = 64


class Listing(NamedTuple):
    """The sessions a page lists, and how many older ones it leaves out."""

    rows: list[dict]
    not_listed: int


async def session_ids(store: EventStore, partitions: int) -> list[str]:
    """Every registered session's id, sorted (time-ordered ids: oldest first)."""
    return sorted([session_id for partition in range(partitions)
                   for session_id in await directory.registered(store.redis, partition)])


async def sessions(store: EventStore, partitions: int, limit: int = MAX_SESSIONS) -> Listing:
    """The newest ``limit`` sessions: origin, status, position and open mail, sorted by id (time-ordered ids:
    oldest first); and how many older ones are not listed."""
    ids = await session_ids(store, partitions)
    listed = ids[-limit:] if limit > 0 else []
    records = [r for r in (await store.directory.many(listed)).values() if r is not None]
    loaded = await store.load_many(records)
    rows = []
    for record in records:
        found = loaded.get(record.session_id)
        state = found.state if found else None
        rows.append({
            "session_id": record.session_id, "handle": record.handle, "agent_type": record.agent_type,
            "description": record.description, "root_session_id": record.root_session_id,
            "parent_session_id": record.parent_session_id, "partition": record.partition,
            "status": state.status if state else "unknown", "run_id": state.current_run if state else None,
            "position": found.version if found else 0, "pending": state.pending_all if state else 0,
            "disposal": state.disposal if state else None,
        })
    return Listing(sorted(rows, key=lambda r: r["session_id"]), len(ids) - len(listed))


def trees(rows: list[dict]) -> list[dict]:
    """The delegation trees: each root with its children nested, in registration order.

    A session whose parent is not listed (older than the listing, or its record gone) stands as a root, and so
    does one nested ``MAX_DEPTH`` deep (a runaway delegation): no listed session is left off the trees."""
    by_parent: dict[str | None, list[dict]] = {}
    for row in rows:
        by_parent.setdefault(row["parent_session_id"], []).append(row)
    known = {row["session_id"] for row in rows}
    standing = [row for row in rows if row["parent_session_id"] not in known]

    def node(row: dict, depth: int) -> dict:
        children = by_parent.get(row["session_id"], [])
        if depth + 1 == MAX_DEPTH:
            standing.extend(children)  # too deep to nest: each child heads a tree of its own, after these
            children = []
        return {**row, "children": [node(child, depth + 1) for child in children]}

    found = []
    while len(found) < len(standing):
        found.append(node(standing[len(found)], 0))
    return found


def walk(tree: dict, depth: int = 0) -> list[tuple[int, dict]]:
    """A tree of ``trees`` as its sessions in the order the page lists them (each before its children), with
    their depths."""
    found = [(depth, tree)]
    for child in tree["children"]:
        found += walk(child, depth + 1)
    return found


async def history(store: EventStore, session_id: str) -> tl.History:
    record = await store.directory.get(session_id)
    if record is None:
        raise UnknownSessionError(f"no session has id {session_id}")
    return await store.read(record)


class HistoryCache:
    """Histories read whole once, then only what was appended since: a live page reads a session and the
    sessions it sent to again at every event, and reading is most of what a timeline costs (a 2,000-event
    session: 77 ms to read, 10 to fold). A session stream only grows, so what was read stays true; a stream
    behind what was read (a server that lost its last writes) is read whole again."""

    def __init__(self, store: EventStore, max_bytes: int = DEFAULT_HISTORY_CACHE_BYTES) -> None:
        if max_bytes < 0:
            raise ValueError(f"a history cache's budget is a number of bytes >= 0, got {max_bytes}")
        self.store = store
        self.max_bytes = max_bytes
        # session id -> (its events, the position read to, their estimated bytes), least recently read first.
        self._kept: OrderedDict[str, tuple[list, int, int]] = OrderedDict()
        self.bytes = 0

    async def read(self, session_id: str) -> tl.History:
        record = await self.store.directory.get(session_id)
        if record is None:
            raise UnknownSessionError(f"no session has id {session_id}")
        version = int(await self.store.redis.hget(keys.session_snapshot(record.partition, session_id), "version")
                      or 0)
        events, read_to, size = self._forget(session_id)
        if version < read_to:
            events, read_to, size = [], 0, 0
        if version > read_to:
            new = await self.store.read(record, after=read_to)
            events.extend(new)  # the cache's own list: every caller gets a copy
            size += sum(event_bytes(event) for _, event in new)
            read_to = max(version, new[-1][0] if new else 0)
        if size <= self.max_bytes:
            self._keep(session_id, events, read_to, size)
        return list(events)

    def _forget(self, session_id: str) -> tuple[list, int, int]:
        events, read_to, size = self._kept.pop(session_id, ([], 0, 0))
        self.bytes -= size
        return events, read_to, size

    def _keep(self, session_id: str, events: list, read_to: int, size: int) -> None:
        self._kept[session_id] = (events, read_to, size)
        self.bytes += size
        while self.bytes > self.max_bytes:
            self._forget(next(iter(self._kept)))

    def __contains__(self, session_id: str) -> bool:
        return session_id in self._kept


def event_bytes(event) -> int:
    """An estimate of the memory a decoded event holds: its text (a body is most of it) and a fixed overhead.
    Cheap enough to take once per event read (a serialization would cost more than the read)."""
    size = EVENT_OVERHEAD_BYTES
    for value in event.__dict__.values():
        if isinstance(value, str):
            size += len(value)
        elif isinstance(value, (list, dict)):
            size += len(repr(value))  # content blocks (an image's data), rules: rare, and then large
    return size


async def histories_for(store: EventStore, session_id: str, *, whole_tree: bool = False,
                        read: Read | None = None) -> dict[str, tl.History]:
    """The session's history and its fork sources' (a fork opens with what its source had seen); with
    ``whole_tree``, every member of its tree and the senders its mail names (for a causal chain). ``read``:
    how a history is read (a ``HistoryCache``'s), by default whole from the store."""
    read = read or (lambda sid: history(store, sid))
    found: dict[str, tl.History] = {session_id: await read(session_id)}
    wanted = [session_id]
    if whole_tree:
        record = await store.directory.get(session_id)
        wanted += await store.directory.tree_members(record.partition, record.root_session_id)
    for _ in range(16):  # the tree, then fork sources and the senders its mail names, a bounded walk
        if not wanted:
            break
        for sid in wanted:
            if sid not in found and await store.directory.get(sid) is not None:
                found[sid] = await read(sid)
        wanted = sorted(_named(found, whole_tree) - set(found))
    return found


async def with_recipients(store: EventStore, session_id: str, found: dict[str, tl.History], *,
                          read: Read | None = None) -> dict[str, tl.History]:
    """``found`` and the histories of the sessions ``session_id`` recorded sending to: what it sent lies on
    its recipients' streams, where its threads (``timeline.threads``) read it."""
    read = read or (lambda sid: history(store, sid))
    named = {e.recipient_session_id for _, e in found.get(session_id, ()) if type(e).__name__ == "MessageSent"}
    for sid in sorted(named - set(found)):
        if await store.directory.get(sid) is not None:
            found[sid] = await read(sid)
    return found


def _named(found: dict[str, tl.History], senders: bool) -> set[str]:
    named: set[str] = set()
    for events in found.values():
        for _, event in events:
            source = getattr(event, "source_session_id", None)
            if source and type(event).__name__ == "SessionForked":
                named.add(source)
            if senders and getattr(event, "sender_session_id", None):
                named.add(event.sender_session_id)
    return named


async def obligations(store: EventStore, rows: list[dict]) -> list[dict]:
    """Mail not yet processed, per session: pending (with its attempts so far), claimed or parked."""
    out = []
    records = [r for r in (await store.directory.many([row["session_id"] for row in rows])).values() if r]
    for record in records:
        for item in sorted((await store.load_mail(record)).values(), key=lambda m: m.seq):
            out.append({
                "session_id": record.session_id, "handle": record.handle, "message_id": item.message_id,
                "owner": item.owner, "sender_session_id": item.sender_session_id, "state": item.state,
                "attempts": item.attempts, "retry_at": item.retry_at, "reason": item.reason, "position": item.seq,
            })
    return out
