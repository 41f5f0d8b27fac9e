"""The batches a worker has in hand at once, per command stream (``ServiceConfig.batches_in_flight``).

One worker spent about a third of a backlog waiting: it read a batch, decided
it, and waited for its appends before FastStream read the next one. A batch
handed over here runs as a task of its own, so the handler returns and the
next batch is read and decided while the first one's appends are on the wire,
on the states they leave (each append checks their etags, as any writer's
does). Only where that pays: on a stream no other live worker reads (the
worker's health probe looks every second). Elsewhere the second batch would be
decided on states the others have moved on, and conflict (BENCHMARKS.md).
"""

import asyncio
from collections.abc import Awaitable, Callable


class BatchesInFlight:
    def __init__(self, limit: int) -> None:
        self.limit = limit
        # The command streams no other live worker reads: only their batches are taken in flight.
        self.read_alone: frozenset[str] = frozenset()
        self._slots: dict[str, asyncio.Semaphore] = {}
        self._tasks: set[asyncio.Task] = set()

    def may_take(self, stream: str) -> bool:
        return self.limit > 1 and stream in self.read_alone

    async def take(self, stream: str, batch: Callable[[], Awaitable[None]]) -> None:
        """Run ``batch`` as a task once the stream has a free slot; returns when it first waits for the server.

        ``batch`` must not raise: a failed batch stays pending, and whatever reports it is the caller's.
        """
        slots = self._slots.get(stream)
        if slots is None:
            slots = self._slots[stream] = asyncio.Semaphore(self.limit)
        await slots.acquire()
        task = asyncio.create_task(self._run(batch, slots))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        # The batch runs first, up to its first wait for the server (its appends sent), and only then does
        # FastStream send the next read: a lone command is not held back behind it.
        await asyncio.sleep(0)

    @staticmethod
    async def _run(batch: Callable[[], Awaitable[None]], slots: asyncio.Semaphore) -> None:
        try:
            await batch()
        finally:
            slots.release()

    async def finish(self, timeout: float) -> None:
        """Wait for the batches in hand (a stopping worker finishes them rather than cutting them short)."""
        if self._tasks:
            await asyncio.wait(set(self._tasks), timeout=timeout)
