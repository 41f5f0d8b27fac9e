"""The members set of the live workers (``keys.worker_members``), which shares the command streams out.

An entry is a worker's consumer name with how many command streams it is configured with; its score is
when it last said it was alive, by the server's clock (one clock for every host: hosts whose clocks
disagree would disagree on who is alive). Who owns which stream is ``consumers/ownership.py``'s.
"""

from . import keys

# KEYS[1] the members set; ARGV[1] this worker's entry, ARGV[2] how long a heartbeat lasts (ms), ARGV[3] '1'
# to leave. Drops the entries silent longer than that, and returns the live ones.
HEARTBEAT_LUA = """
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

Worker = tuple[str, int]  # consumer name, how many command streams it is configured with


def entry(worker: Worker) -> str:
    """Its stream count first, so that a name may hold anything."""
    consumer, streams = worker
    return f"{streams} {consumer}"


def parse(raw: bytes | str) -> Worker:
    streams, consumer = (raw.decode() if isinstance(raw, bytes) else raw).split(" ", 1)
    return consumer, int(streams)


async def live(redis, timeout_ms: int) -> list[Worker]:
    """The workers that said they were alive within ``timeout_ms``, read without changing the set."""
    seconds, micros = await redis.time()
    now_ms = seconds * 1000 + micros // 1000
    return [parse(raw) for raw in await redis.zrangebyscore(keys.worker_members(), now_ms - timeout_ms, "+inf")]


class Membership:
    """One worker's entry in the members set."""

    def __init__(self, redis, me: Worker, timeout_ms: int) -> None:
        self._script = redis.register_script(HEARTBEAT_LUA)
        self.me = me
        self.timeout_ms = timeout_ms

    @property
    def interval_s(self) -> float:
        """A quarter of the timeout: a live worker misses three heartbeats in a row before it is taken for dead."""
        return self.timeout_ms / 4000

    async def beat(self) -> list[Worker]:
        """Say this worker is alive; returns the live workers, this one among them."""
        return await self._call(leaving=False)

    async def leave(self) -> None:
        """Leave at once (a stopping worker): the others take its streams at their next heartbeat."""
        await self._call(leaving=True)

    async def _call(self, leaving: bool) -> list[Worker]:
        raw = await self._script(keys=[keys.worker_members()],
                                 args=[entry(self.me), self.timeout_ms, "1" if leaving else "0"])
        return [parse(item) for item in raw]


async def announce(redis, key: str, member: str, timeout_ms: int, leaving: bool = False) -> None:
    """A process other than a worker saying it is alive in the presence set ``key`` (or leaving it)."""
    await redis.eval(HEARTBEAT_LUA, 1, key, member, timeout_ms, "1" if leaving else "0")


async def present(redis, key: str, timeout_ms: int) -> list[str]:
    """Who said they were alive in ``key`` within ``timeout_ms``, read without changing the set."""
    seconds, micros = await redis.time()
    now_ms = seconds * 1000 + micros // 1000
    return [m.decode() if isinstance(m, bytes) else m
            for m in await redis.zrangebyscore(key, now_ms - timeout_ms, "+inf")]
