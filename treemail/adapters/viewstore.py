"""Reading and writing projection views and checkpoints: the one place that knows their keys.

A view and its checkpoint are written in one MULTI/EXEC on the partition's
hash slot, so a crash leaves either both or neither.
"""

from dataclasses import dataclass

from redis.asyncio import Redis
from redis.exceptions import ResponseError

from . import keys

# A view is a flat mapping of field -> value, one Redis hash per partition.
View = dict[str, str]


@dataclass(frozen=True)
class Checkpoint:
    """A position in a partition feed, and how many feed entries that position covers."""

    entry_id: str = "0-0"
    entries: int = 0

    def encode(self) -> str:
        return f"{self.entry_id} {self.entries}"

    @classmethod
    def decode(cls, raw: bytes | str | None) -> "Checkpoint | None":
        if raw is None:
            return None
        text = raw.decode() if isinstance(raw, bytes) else raw
        entry_id, entries = text.split()
        return cls(entry_id, int(entries))


def id_tuple(entry_id: str) -> tuple[int, int]:
    ms, _, seq = entry_id.partition("-")
    return int(ms), int(seq or 0)


class TrackedView(dict):
    """A view that remembers which fields changed since the last write."""

    def __init__(self, *args) -> None:
        super().__init__(*args)
        self.touched: set[str] = set()

    def __setitem__(self, key, value) -> None:
        self.touched.add(key)
        super().__setitem__(key, value)

    def pop(self, key, *default):
        self.touched.add(key)
        return super().pop(key, *default)


async def load_view(redis: Redis, partition: int, name: str) -> tuple[TrackedView, Checkpoint | None]:
    async with redis.pipeline(transaction=False) as pipe:
        pipe.hgetall(keys.projection_view(partition, name))
        pipe.get(keys.projection_checkpoint(partition, name))
        raw, checkpoint = await pipe.execute()
    view = TrackedView({k.decode(): v.decode() for k, v in raw.items()})
    return view, Checkpoint.decode(checkpoint)


def queue_changes(pipe, partition: int, name: str, view: TrackedView, checkpoint: Checkpoint) -> None:
    key = keys.projection_view(partition, name)
    present = {f: view[f] for f in view.touched if f in view}
    gone = [f for f in view.touched if f not in view]
    if present:
        pipe.hset(key, mapping=present)
    if gone:
        pipe.hdel(key, *gone)
    pipe.set(keys.projection_checkpoint(partition, name), checkpoint.encode())
    view.touched.clear()


def queue_replace(pipe, partition: int, name: str, view: View, checkpoint: Checkpoint) -> None:
    key = keys.projection_view(partition, name)
    pipe.delete(key)
    items = list(view.items())
    for start in range(0, len(items), 1000):
        pipe.hset(key, mapping=dict(items[start:start + 1000]))
    pipe.set(keys.projection_checkpoint(partition, name), checkpoint.encode())


async def feed_position(redis: Redis, partition: int) -> tuple[Checkpoint, int]:
    """Where the feed ends now (as a checkpoint), and how many of its entries trimming removed."""
    try:
        info = await redis.xinfo_stream(keys.feed(partition))
    except ResponseError:
        return Checkpoint(), 0
    last = info["last-generated-id"]
    last_id = last.decode() if isinstance(last, bytes) else last
    added = int(info.get("entries-added", 0))
    return Checkpoint(last_id, added), added - int(info["length"])
