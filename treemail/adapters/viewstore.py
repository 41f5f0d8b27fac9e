"""Reading and writing projection views and checkpoints: the one place that knows their keys.

A view and its checkpoint are written in one atomic step on the partition's
hash slot (a MULTI/EXEC, or the script of ``write_changes``), so a crash
leaves either both or neither.
"""

from dataclasses import dataclass
from itertools import chain

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


# KEYS: each view's hash and its checkpoint, in pairs. ARGV, for each view in turn: the checkpoint its changes
# were folded from, the one they are written with, how many fields are set and how many deleted, the fields set
# (field, value, ...), the fields deleted. Writes nothing, and returns 0, unless every checkpoint is still the
# one its changes were folded from; returns 1 when it wrote them all.
WRITE_CHANGES_LUA = """
local function each_chunk(command, key, first, last)
  -- unpack is bounded by Lua's stack: a step that changed thousands of fields is written 1000 arguments at a time
  for from = first, last, 1000 do
    redis.call(command, key, unpack(ARGV, from, math.min(from + 999, last)))
  end
end
local plans, at = {}, 1
for view = 1, #KEYS / 2 do
  if redis.call('GET', KEYS[2 * view]) ~= ARGV[at] then
    return 0
  end
  local set, gone = tonumber(ARGV[at + 2]), tonumber(ARGV[at + 3])
  plans[view] = {at + 4, set, gone, ARGV[at + 1]}
  at = at + 4 + 2 * set + gone
end
for view, plan in ipairs(plans) do
  local first, set, gone, checkpoint = plan[1], plan[2], plan[3], plan[4]
  each_chunk('HSET', KEYS[2 * view - 1], first, first + 2 * set - 1)
  each_chunk('HDEL', KEYS[2 * view - 1], first + 2 * set, first + 2 * set + gone - 1)
  redis.call('SET', KEYS[2 * view], checkpoint)
end
return 1
"""


@dataclass(frozen=True)
class Changes:
    """What one step changed in one view: its changed fields (``TrackedView.touched``), the checkpoint it was
    folded from, and the one it is written with."""

    name: str
    view: TrackedView
    folded_from: Checkpoint
    checkpoint: Checkpoint


class ViewWriter:
    """Writes the changes of one step to views of one partition, each with its new checkpoint."""

    def __init__(self, redis: Redis) -> None:
        self._script = redis.register_script(WRITE_CHANGES_LUA)

    async def write_changes(self, partition: int, changes: list[Changes]) -> bool:
        """Writes them all and returns True if the server still holds every view as it was folded from; else
        writes nothing and returns False. Only the changed fields are written, so changes written over a copy
        the server no longer holds as it was (it lost a write: a failover to a replica that had not received
        it) would leave what that write changed wrong for good."""
        view_keys, args = [], []
        for change in changes:
            view = change.view
            present = {f: view[f] for f in view.touched if f in view}
            gone = [f for f in view.touched if f not in view]
            view_keys += [keys.projection_view(partition, change.name),
                          keys.projection_checkpoint(partition, change.name)]
            args += [change.folded_from.encode(), change.checkpoint.encode(), len(present), len(gone),
                     *chain.from_iterable(present.items()), *gone]
        if not await self._script(keys=view_keys, args=args):
            return False
        for change in changes:
            change.view.touched.clear()
        return True


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
