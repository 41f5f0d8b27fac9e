"""Which command streams a worker reads: each stream is one live worker's, the streams shared out evenly.

Workers that take turns at one stream's batches decide one sender's commands at once and conflict on its
record: on the benchmark machine two workers decided 0.8 times what one did, and four half
(BENCHMARKS.md, issue 17, tenth pass). So each worker says it is alive in a sorted set, by the server's
clock (one clock for every host), and each shares the streams out the same way over the same live workers.

Ownership only spares work; correctness never rests on it. Every append checks the etags of the states
its decision read, so two workers that read one stream for a moment (one has not yet seen the other join
or leave) still decide correctly, with conflicts. The streams of a worker that died are read again once
it is ``worker_timeout_ms`` silent; the commands it held are reclaimed after ``reclaim_idle_ms``, as before.
"""

from collections.abc import Iterable

from treemail.adapters import keys

from .entries import text

# KEYS[1] the members set; ARGV[1] this worker, ARGV[2] how long a heartbeat lasts (ms), ARGV[3] '1' to leave.
# Returns the live members. The server's clock, not each host's: hosts whose clocks disagree would disagree
# on who is alive, and so on who owns what.
MEMBERSHIP_LUA = """
local now = redis.call('TIME')
local ms = tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000)
if ARGV[3] == '1' then
  redis.call('ZREM', KEYS[1], ARGV[1])
else
  redis.call('ZADD', KEYS[1], ms, ARGV[1])
end
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', ms - tonumber(ARGV[2]))
return redis.call('ZRANGE', KEYS[1], 0, -1)
"""


def owned_streams(live: Iterable[tuple[str, int]], me: tuple[str, int]) -> frozenset[int]:
    """The command streams ``me`` reads. Each worker is (name, how many command streams it is configured
    with); stream i goes to the (i mod n)-th in name order of the n live workers configured with more than i
    streams. So every stream some worker is configured to read has exactly one reader, none is given to a
    worker that would not read it (a pool part-way through a change of ``command_streams``), and where all
    agree each reads streams // n of them or one more. ``me`` counts as live: a worker reads its share from
    its first heartbeat on, before it sees itself in the set."""
    members = sorted(set(live) | {me})
    owned = set()
    for index in range(me[1]):
        readers = [member for member in members if member[1] > index]
        if readers[index % len(readers)] == me:
            owned.add(index)
    return frozenset(owned)


def member(consumer: str, streams: int) -> str:
    """A worker's entry in the members set: its stream count first, so that its name may hold anything."""
    return f"{streams} {consumer}"


def parse_member(entry: str) -> tuple[str, int]:
    streams, consumer = entry.split(" ", 1)
    return consumer, int(streams)


class Membership:
    """One worker's entry in the members set (``keys.worker_members``)."""

    def __init__(self, redis, consumer: str, streams: int, timeout_ms: int) -> None:
        self._script = redis.register_script(MEMBERSHIP_LUA)
        self.me = (consumer, streams)
        self.timeout_ms = timeout_ms

    @property
    def interval_s(self) -> float:
        """A quarter of the timeout: a live worker misses three heartbeats in a row before it is taken for dead."""
        return self.timeout_ms / 4000

    async def beat(self) -> list[tuple[str, int]]:
        """Say this worker is alive; returns the live workers (name, streams), this one among them."""
        return await self._call(leaving=False)

    async def leave(self) -> None:
        """Leave at once (a stopping worker): the others take its streams at their next heartbeat."""
        await self._call(leaving=True)

    async def _call(self, leaving: bool) -> list[tuple[str, int]]:
        entries = await self._script(keys=[keys.worker_members()],
                                     args=[member(*self.me), self.timeout_ms, "1" if leaving else "0"])
        return [parse_member(text(entry)) for entry in entries]
