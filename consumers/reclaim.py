"""The reclaim pass: heal, take over commands a dead (or stuck) worker left pending, trim the queues.

A command idle for ``reclaim_idle_ms`` in another consumer's pending list is XAUTOCLAIMed and decided again;
idempotency makes that second decision return the first one's result. The same pass trims what every reader
has handled from the command and wake streams (``retention.trim_handled``).
"""

from collections.abc import Callable

from treemail.adapters import keys
from treemail.adapters.config import ServiceConfig
from treemail.adapters.retention import trim_handled

from .batches import CommandBatches
from .healing import Healing


class Reclaim:
    def __init__(self, config: ServiceConfig, consumer: str, redis, batches: CommandBatches, healing: Healing,
                 owned: Callable[[], frozenset[int]]) -> None:
        self.config = config
        self.consumer = consumer
        self.redis = redis
        self.batches = batches
        self.healing = healing
        self.owned = owned

    async def run_pass(self) -> None:
        await self.healing.heal()
        await self.reclaim()
        await self.trim()

    async def reclaim(self) -> int:
        """Take over commands idle in a dead (or stuck) consumer's pending list and decide them.

        FastStream's own XAUTOCLAIM subscriber claims one entry per round trip;
        this claims a batch at a time. A command delivered more than
        ``max_deliveries`` times is poison (its decision keeps failing): it
        moves to the dead-letter stream with the reason, and its producer is
        told, instead of blocking the stream forever.
        """
        taken = 0
        for index in sorted(self.owned()):  # a stream's owner decides its commands, new or reclaimed
            stream = keys.command_stream(index)
            start = "0-0"
            while True:
                start, entries, *_ = await self.redis.xautoclaim(
                    stream, keys.COMMAND_GROUP, self.consumer, self.config.reclaim_idle_ms, start_id=start,
                    count=self.config.batch_size,
                )
                live = [(entry_id, fields) for entry_id, fields in entries if fields]
                if live:
                    taken += await self.batches.decide_reclaimed(stream, live)
                if start in (b"0-0", "0-0"):
                    break
        return taken

    async def trim(self) -> int:
        """Drop commands and wakes every reader has handled (they are queues; the session streams are history).

        Any number of workers may trim at once.
        """
        dropped = 0
        for index in range(self.config.command_streams):
            dropped += await trim_handled(self.redis, keys.command_stream(index))
        for partition in range(self.config.partitions):
            dropped += await trim_handled(self.redis, keys.wake_stream(partition))
        return dropped
