"""The projection worker: follow the partition feeds, fold, write view and checkpoint atomically.

One process follows any set of partitions with one blocking XREAD. On start
each (projection, partition) resumes from its checkpoint; one with no
checkpoint (a projection added later) or whose checkpoint the trimmed feed
has already dropped is rebuilt from the session streams first. So is one
that falls that far behind while it runs (``feed_maxlen``): read on, it
would go on from the oldest entry still kept and never fold the rest.
"""

import asyncio
import logging
import time


from treemail.adapters import feed, keys, metrics
from treemail.adapters.config import Config
from treemail.adapters.eventstore import EventStore
from treemail.adapters.viewstore import (
    Changes, Checkpoint, TrackedView, ViewWriter, feed_position, id_tuple, load_view,
)
from treemail.domain import events as ev
from treemail.domain import protocol

from .replay import rebuild
from .views import PROJECTIONS, fold_event

log = logging.getLogger("treemail.projections")


def _text(value) -> str:
    return value.decode() if isinstance(value, bytes) else value


def _trimmed_past(checkpoint: Checkpoint, trimmed: int) -> bool:
    """Trimming removed entries a view at ``checkpoint`` never folded: only the session streams still have them."""
    return trimmed > checkpoint.entries


class ProjectionRunner:
    def __init__(
        self, store: EventStore, config: Config, partitions: list[int] | None = None, names: list[str] | None = None,
        batch: int = 1000,
    ) -> None:
        self.store = store
        self.redis = store.redis
        self.config = config
        self.partitions = partitions if partitions is not None else list(range(config.service.partitions))
        self.names = names or list(PROJECTIONS)
        self.batch = batch
        self.views: dict[tuple[str, int], TrackedView] = {}
        # The event types some followed projection folds: only these are read from the session streams.
        self._read_types = {cls.__name__ for name in self.names for cls in PROJECTIONS[name].reads}
        self.checkpoints: dict[tuple[str, int], Checkpoint] = {}
        self.writer = ViewWriter(self.redis)

    async def start(self) -> None:
        for partition in self.partitions:
            await self._load(partition)

    async def _load(self, partition: int) -> None:
        """Each view of ``partition`` and its checkpoint as the server holds them; one with no checkpoint, or
        whose checkpoint the trimmed feed has dropped, rebuilt from the session streams."""
        _, trimmed = await feed_position(self.redis, partition)
        stale = []
        for name in self.names:
            view, checkpoint = await load_view(self.redis, partition, name)
            if checkpoint is None or _trimmed_past(checkpoint, trimmed):
                stale.append(name)
            else:
                self.views[(name, partition)] = view
                self.checkpoints[(name, partition)] = checkpoint
        if stale:
            await self._rebuild(partition, stale)

    async def _rebuild_trimmed_past(self) -> None:
        """Rebuild the views whose checkpoint the feed was trimmed past since they last folded: looked at before
        every read, since a read past a trimmed checkpoint starts at the oldest entry kept and says nothing."""
        trimmed = await asyncio.gather(*(feed_position(self.redis, p) for p in self.partitions))
        for partition, (_, gone) in zip(self.partitions, trimmed):
            stale = [n for n in self.names if _trimmed_past(self.checkpoints[(n, partition)], gone)]
            if stale:
                log.warning("partition %d's feed was trimmed past what %s folded (feed_maxlen): rebuilding",
                            partition, ", ".join(stale))
                await self._rebuild(partition, stale)

    async def _rebuild(self, partition: int, names: list[str]) -> None:
        log.warning("rebuilding %s of partition %d from the streams", ", ".join(names), partition)
        rebuilt = await rebuild(self.store, [partition], names)
        for (name, p), view in rebuilt.items():
            self.views[(name, p)] = view
            self.checkpoints[(name, p)] = (await load_view(self.redis, p, name))[1]

    async def _lost_what_it_folded(self, partition: int) -> bool:
        """Whether the server no longer has the last feed entry this runner folded of ``partition``: it lost its
        last writes (a failover to a replica that had not received them, a server back from an older copy).
        The views held here then count events no stream has, and so may the server's copy: a write of views
        and checkpoint in flight at the failover is sent again to the new primary by the cluster client."""
        last = max((self.checkpoints[(n, partition)] for n in self.names), key=lambda c: id_tuple(c.entry_id))
        if last.entries == 0:
            return False
        async with self.redis.pipeline(transaction=False) as pipe:
            pipe.xrange(keys.feed(partition), min=last.entry_id, max=last.entry_id, count=1)
            pipe.xrange(keys.feed(partition), count=1)
            still_there, first = await pipe.execute()
        # Gone because trimming took it (every reader had handled it) leaves the feed starting after it; lost
        # with the server's last writes leaves the entries before it in place.
        return not still_there and bool(first) and id_tuple(_text(first[0][0])) < id_tuple(last.entry_id)

    def _position(self, partition: int) -> str:
        return min((self.checkpoints[(n, partition)] for n in self.names),
                   key=lambda c: id_tuple(c.entry_id)).entry_id

    async def step(self, block_ms: int | None = 1000) -> int:
        """Read one batch from every followed feed, fold it, write it. Returns the entries folded."""
        await self._rebuild_trimmed_past()
        streams = {keys.feed(p): self._position(p) for p in self.partitions}
        if self.config.service.cluster:
            # One stream per read: the partitions' feeds live in different slots.
            replies = [r for reply in await asyncio.gather(*(
                self.redis.xread({stream: position}, count=self.batch, block=block_ms)
                for stream, position in streams.items()
            )) for r in reply or []]
        else:
            replies = await self.redis.xread(streams, count=self.batch, block=block_ms)
        folded = 0
        for stream, entries in replies or []:
            partition = self.partitions[list(streams).index(stream.decode() if isinstance(stream, bytes) else stream)]
            folded += await self._fold(partition, entries)
        await self._report_lag()
        return folded

    async def _fold(self, partition: int, entries: list) -> int:
        if await self._lost_what_it_folded(partition):
            log.warning("partition %d's feed lost entries this runner had folded (the server lost its last writes)",
                        partition)
            await self._rebuild(partition, list(self.names))
            return 0  # the next step reads on from where the rebuild ended
        decoded, entry_ids = [], []
        for entry in await feed.resolve(self.redis, partition, entries, self._read_types.__contains__):
            if entry.newer:
                # Skipped and reported: folding what this version may misread would be worse.
                log.warning("feed entry %s of partition %d: %s; skipped (run `treemail replay` after upgrading)",
                            entry.entry_id, partition, protocol.NewerProtocol(entry.version, "it"))
            if entry.session_id:  # a newer protocol's entry may name no session this reader can read
                decoded.append((entry.entry_id, entry.session_id, entry.seq, entry.event))
            entry_ids.append(entry.entry_id)
        changes, applied, wakes = [], {}, 0
        for name in self.names:
            key = (name, partition)
            view, checkpoint = self.views[key], self.checkpoints[key]
            projection = PROJECTIONS[name]
            applied[name] = 0
            for entry_id, session_id, seq, event in decoded:
                if id_tuple(entry_id) <= id_tuple(checkpoint.entry_id):
                    continue
                if fold_event(view, projection, session_id, seq, event) and name == "wakes" and isinstance(
                    event, ev.SessionWakeRequested
                ):
                    wakes += 1
                applied[name] += 1
            # The checkpoint counts feed entries (what trimming counts), and one names a whole step.
            entries = len({i for i in entry_ids if id_tuple(i) > id_tuple(checkpoint.entry_id)})
            if entries:
                changes.append(Changes(name, view, checkpoint, Checkpoint(entry_ids[-1], checkpoint.entries + entries)))
        if changes and not await self.writer.write_changes(partition, changes):
            # The server lost a write of these views (a failover to a replica that had not received it): its copy
            # lacks what that write changed. Its views and checkpoints are still one atomic write's, and a replica
            # receives writes in order, so every feed entry that copy counts is there: fold on from it.
            log.warning("partition %d's views are not as this runner last wrote them (the server lost its last "
                        "writes); folding on from the server's copy", partition)
            await self._load(partition)
            return 0  # the next step reads on from the server's checkpoints
        for change in changes:
            self.checkpoints[(change.name, partition)] = change.checkpoint
            metrics.PROJECTION_EVENTS.labels(change.name).inc(applied[change.name])
        metrics.WAKES.inc(wakes)
        return len(entry_ids)

    def report_views(self) -> None:
        """Aggregate gauges over this runner's partitions: bounded cardinality, never one series per session."""
        messaging = self.config.messaging

        def values(name: str) -> list[int]:
            return [int(v) for p in self.partitions for f, v in self.views[(name, p)].items()
                    if not f.startswith("seq:")] if name in self.names else []

        inbox, pairs = values("inbox"), values("pairs")
        metrics.PENDING_INBOX.set(sum(inbox))
        metrics.FULL_INBOXES.set(sum(1 for v in inbox if v >= messaging.max_pending_per_session))
        metrics.INFLIGHT_PAIRS.set(len(pairs))
        window = messaging.max_inflight_per_pair
        metrics.FULL_WINDOWS.set(sum(1 for v in pairs if window and v >= window))
        if "wakes" in self.names:
            metrics.WAKES_OUTSTANDING.set(sum(
                1 for p in self.partitions for f in self.views[("wakes", p)] if not f.startswith("seq:")
            ))

    async def _report_lag(self) -> None:
        now = time.time()
        for partition in self.partitions:
            end, _ = await feed_position(self.redis, partition)
            for name in self.names:
                checkpoint = self.checkpoints[(name, partition)]
                behind = max(0, end.entries - checkpoint.entries)
                metrics.PROJECTION_LAG_EVENTS.labels(name, str(partition)).set(behind)
                seconds = 0.0
                if behind:
                    nxt = await self.redis.xrange(keys.feed(partition), min=f"({checkpoint.entry_id}", count=1)
                    if nxt:
                        seconds = max(0.0, now - id_tuple(nxt[0][0].decode())[0] / 1000)
                metrics.PROJECTION_LAG_SECONDS.labels(name, str(partition)).set(seconds)
