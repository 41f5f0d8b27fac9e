"""Sharing the command streams out among the live workers (``ownership``): say this worker is alive, read
the streams it owns now, and hand over the others, deciding first what it read of them."""

import asyncio
import logging

from treemail.adapters import keys
from treemail.adapters.config import ServiceConfig
from treemail.adapters.health import OutageLog
from treemail.adapters.members import Membership

from .batches import CommandBatches
from .commandsubscribers import CommandSubscribers
from .healing import Healing
from .inflight import BatchesInFlight
from .ownership import owned_streams
from .periodic import report_failure

log = logging.getLogger("treemail.worker")

# A stopping worker's steps on the server (leaving the members set, deciding what it read and dropped) give
# up after this long each: what is left then is taken over as a dead worker's would be.
STOP_STEP_S = 5.0


class StreamSharing:
    def __init__(self, config: ServiceConfig, consumer: str, redis, membership: Membership,
                 subscribers: CommandSubscribers, in_flight: BatchesInFlight, batches: CommandBatches,
                 healing: Healing, outages: OutageLog) -> None:
        self.config = config
        self.consumer = consumer
        self.redis = redis
        self.membership = membership
        self.subscribers = subscribers
        self.in_flight = in_flight
        self.batches = batches
        self.healing = healing
        self.outages = outages

    async def share(self) -> None:
        """Say this worker is alive, then read the command streams it owns now and stop reading the others
        (``ownership``); every stream when ``exclusive_streams`` is off."""
        service = self.config
        live = await self.membership.beat()
        owned = (owned_streams(live, self.membership.me) if service.exclusive_streams
                 else frozenset(range(service.command_streams)))
        if owned != self.subscribers.owned:
            log.info("worker %s reads command streams %s of %d (%d live workers)", self.consumer,
                     sorted(owned), service.command_streams, len(live))
        released = await self.subscribers.own(owned, self.healing.ensure_group)
        if service.exclusive_streams and service.batches_in_flight > 1:
            self.in_flight.read_alone = frozenset(keys.command_stream(index) for index in owned)
        for stream in released:
            await self.finish_pending(stream)

    async def finish_pending(self, stream: str) -> None:
        """Decide what this worker read of ``stream`` and has not handled. A stopped subscriber drops the
        batch of a read that was on the wire: it stays in this worker's pending list, where only reclaim,
        ``reclaim_idle_ms`` later, would find it."""
        await self.in_flight.finish(timeout=self.batches.step_deadline_s)
        replies = await self.redis.xreadgroup(keys.COMMAND_GROUP, self.consumer, {stream: "0"},
                                              count=self.config.batch_size)
        for _, entries in replies:
            live = [(entry_id, fields) for entry_id, fields in entries if fields]
            if live:
                await self.batches.decide_reclaimed(stream, live)

    async def leave(self) -> None:
        """Leave the members set first, so the others take the streams over at their next beat, not after
        ``worker_timeout_ms``."""
        try:
            async with asyncio.timeout(STOP_STEP_S):
                await self.membership.leave()
        except Exception as exc:  # noqa: BLE001 - the others take over after the timeout instead
            report_failure(self.outages, "leaving the members set", exc)

    async def finish_owned_pending(self) -> None:
        try:
            async with asyncio.timeout(STOP_STEP_S):
                for index in sorted(self.subscribers.owned):
                    await self.finish_pending(keys.command_stream(index))
        except Exception as exc:  # noqa: BLE001 - what is left is reclaimed by the streams' next owners
            report_failure(self.outages, "finishing the pending commands", exc)
