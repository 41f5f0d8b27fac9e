"""The worker's subscribers: one FastStream batch subscriber per command stream, of which only those of the
streams the worker owns run (``ownership``).

Two tasks start and stop them: the membership beat (the streams owned changed) and the health probe
(FastStream stopped one for good, on NOGROUP). They take turns under one lock, so a subscriber is never
started by one while the other stops it.
"""

import asyncio
from collections.abc import Awaitable, Callable

from faststream import AckPolicy
from faststream.redis import StreamSub

from treemail.adapters import keys
from treemail.adapters.config import ServiceConfig

from .entries import no_body, raw_batch

# Recreates the command group on every stream, at the streams' start (``EventStore.ensure_command_group``).
EnsureGroup = Callable[[], Awaitable[object]]


class _UnprefixedStreamSub(StreamSub):
    """A command stream subscription FastStream need not copy. FastStream deep-copies a ``StreamSub`` to
    add the broker's prefix every time it reads or logs a batch (about 8 us each, two per batch); the
    worker's broker has no prefix, so the subscription with it added is this one."""

    __slots__ = ()

    def add_prefix(self, prefix: str) -> "StreamSub":
        return self if not prefix else super().add_prefix(prefix)


class CommandSubscribers:
    def __init__(self, broker, service: ServiceConfig, consumer: str, handler) -> None:
        """Registers a subscriber per command stream on ``broker``, each calling ``handler``; none runs yet."""
        self.all: list = []
        for index in range(service.command_streams):
            stream = _UnprefixedStreamSub(
                keys.command_stream(index), group=keys.COMMAND_GROUP, consumer=consumer, batch=True,
                max_records=service.batch_size, polling_interval=100,
            )
            # The worker acknowledges a batch itself, in the same round trip as its answers (one round trip
            # less per batch than FastStream's own XACK after the handler returns).
            subscriber = broker.subscriber(stream=stream, parser=raw_batch, decoder=no_body,
                                           ack_policy=AckPolicy.MANUAL)
            subscriber(handler)
            self.all.append(subscriber)
        self.owned: frozenset[int] = frozenset()
        self._changing = asyncio.Lock()

    def stopped(self) -> list:
        """Subscribers of owned streams that are not reading (FastStream stops one on NOGROUP)."""
        return [s for index, s in enumerate(self.all) if index in self.owned and not s.running]

    async def own(self, owned: frozenset[int], ensure_group: EnsureGroup) -> list[str]:
        """Read the streams of ``owned`` and stop reading the others; returns the streams given up."""
        released = []
        async with self._changing:
            # Streams newly owned start here; one owned before that FastStream stopped is revive's to restart.
            gained = [self.all[index] for index in sorted(owned - self.owned) if not self.all[index].running]
            self.owned = owned
            if gained:
                # At the streams' start, as at start-up: FastStream would create a missing group at their end
                # and skip what producers wrote since the server lost it.
                await ensure_group()
            for subscriber in gained:
                await subscriber.start()
            for index, subscriber in enumerate(self.all):
                if index not in owned and subscriber.running:
                    await subscriber.stop()
                    released.append(keys.command_stream(index))
        return released

    async def revive(self, ensure_group: EnsureGroup) -> int:
        """Restart the owned streams' subscribers FastStream stopped for good, after recreating the group.

        A server that came back without its data (no AOF, a flush) has no consumer group; FastStream then
        stops the subscriber (NOGROUP) and would never read again.
        """
        async with self._changing:
            stopped = self.stopped()
            if stopped:
                await ensure_group()
                for subscriber in stopped:
                    await subscriber.start()
        return len(stopped)
