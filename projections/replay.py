"""Rebuild projections from the session streams alone: reset the position, fold again.

The rebuild notes where each partition feed ends before it reads any session
set or stream, and checkpoints there. Events appended while it runs are in the streams it
reads and again in the feed after that checkpoint; the per-session positions
in each view make the live runner skip them, so nothing counts twice.
"""

import asyncio
from collections.abc import AsyncIterator, Callable
from contextlib import aclosing

from treemail.adapters import directory
from treemail.adapters.eventstore import EventStore, decode_entries
from treemail.adapters.viewstore import TrackedView, feed_position, queue_replace

from .views import PROJECTIONS, fold_stream

CHUNK = 10_000
# Events folded between two pauses: a pause lets the read ahead (``_read_ahead``) send its request or take in
# its reply. Folding a whole chunk without one leaves the request unsent until the fold is over.
SLICE = 250
# (sessions done, sessions in all, events folded), after each session; entrypoints/output.py shows it.
Progress = Callable[[int, int, int], None]


async def rebuild(
    store: EventStore,
    partitions: list[int],
    names: list[str] | None = None,
    *,
    write: bool = True,
    progress: Progress | None = None,
) -> dict[tuple[str, int], TrackedView]:
    """Views folded from every session stream; written with their checkpoints unless ``write`` is False."""
    names = names or list(PROJECTIONS)
    redis = store.redis
    views: dict[tuple[str, int], TrackedView] = {}
    # Feed positions first, session sets after: a session registered in between is then in the set
    # (and folded here), and one registered later has its whole history after the checkpoint (and is
    # folded by the live runner). Read the other way round, a registration in between was in neither.
    checkpoints = {p: (await feed_position(redis, p))[0] for p in partitions}
    sessions_by_partition = {
        p: await directory.registered(redis, p) for p in partitions
    }
    total = sum(len(s) for s in sessions_by_partition.values())
    done = events = 0
    for partition in partitions:
        checkpoint = checkpoints[partition]
        partition_views: dict[str, dict] = {name: {} for name in names}
        folds = [(partition_views[name], PROJECTIONS[name]) for name in names]
        async with aclosing(_read_ahead(store, sessions_by_partition[partition])) as chunks:
            async for session_id, entries, last in chunks:
                for start in range(0, len(entries), SLICE):
                    await asyncio.sleep(0)
                    fold_stream(folds, session_id, decode_entries(entries[start:start + SLICE]))
                events += len(entries)
                if last:
                    done += 1
                    if progress:
                        progress(done, total, events)
        if write:
            async with redis.pipeline(transaction=True) as pipe:
                for name, view in partition_views.items():
                    queue_replace(pipe, partition, name, view, checkpoint)
                await pipe.execute()
        for name, view in partition_views.items():
            # The live runner writes only what it touches next; nothing is pending from here.
            views[(name, partition)] = TrackedView(view)
    return views


async def _read_ahead(store: EventStore, session_ids: list[str]) -> AsyncIterator[tuple[str, list, bool]]:
    """(session, entries, whether its last chunk) for each session's stream, chunk by chunk, in order.

    The read of the next chunk is started before this one is handed out: the server prepares it while
    this process folds (a read waited for in turn leaves one of the two idle).
    """
    records = await store.directory.many(session_ids)

    async def read(index: int, after: int) -> tuple[int, list]:
        record = records[session_ids[index]]
        return index, (await store.read_entries(record, after, CHUNK) if record is not None else [])

    pending: asyncio.Future | None = asyncio.ensure_future(read(0, 0)) if session_ids else None
    try:
        while pending is not None:
            index, entries = await pending
            last = len(entries) < CHUNK
            if not last:
                pending = asyncio.ensure_future(read(index, int(entries[-1][0].split(b"-")[0])))
            elif index + 1 < len(session_ids):
                pending = asyncio.ensure_future(read(index + 1, 0))
            else:
                pending = None
            yield session_ids[index], entries, last
    finally:
        if pending is not None:
            pending.cancel()

