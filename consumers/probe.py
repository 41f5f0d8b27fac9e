"""The health probe: ready while the server answers and every command stream has the consumer group and a
running subscriber. It heals what it can on the way (a lost group, stopped subscribers)."""

from treemail.adapters import keys
from treemail.adapters.config import ServiceConfig

from .commandsubscribers import CommandSubscribers
from .healing import Healing
from .inflight import BatchesInFlight
from .stats import live_readers


class HealthProbe:
    def __init__(self, config: ServiceConfig, consumer: str, redis, healing: Healing,
                 subscribers: CommandSubscribers, in_flight: BatchesInFlight) -> None:
        self.config = config
        self.consumer = consumer
        self.redis = redis
        self.healing = healing
        self.subscribers = subscribers
        self.in_flight = in_flight

    async def probe(self) -> str | None:
        """None when ready; otherwise why not. Heals what it can: a lost group, stopped subscribers."""
        await self.redis.ping()
        await self.healing.heal()
        missing = await self.healing.streams_without_group()
        if missing:
            return f"consumer group {keys.COMMAND_GROUP} missing on {', '.join(missing)}"
        stopped = len(self.subscribers.stopped())
        if stopped:
            return f"{stopped} command stream subscriber(s) stopped"
        if not self.config.exclusive_streams:
            await self._note_streams_read_alone()
        return None

    async def _note_streams_read_alone(self) -> None:
        """Streams shared: the ones no other live worker reads may have batches in flight."""
        if self.config.batches_in_flight == 1:
            return
        alone = []
        for stream in (keys.command_stream(index) for index in range(self.config.command_streams)):
            if not await live_readers(self.redis, stream, self.config, besides=self.consumer):
                alone.append(stream)
        self.in_flight.read_alone = frozenset(alone)
