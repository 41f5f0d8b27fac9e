"""Looks over every registered session: the sessions whose stored state calls for an action, found a slice at a time.

Sessions stay registered for good, so a look over all of them grows with the deployment. The delivery pump's
and the peer driver's first passes, ``reconcile`` and the pump's periodic look for stranded mail all read the
partitions' session sets, the sessions' directory records and their states, and keep the sessions a test of
the state picks. A look spread over passes reads about ``budget`` states at a time (SSCAN) and says where the
next slice starts, so no single pass waits on the whole population.
"""

from collections.abc import AsyncIterator, Callable
from typing import NamedTuple

from ..adapters import directory
from ..adapters.eventstore import EventStore
from ..domain.records import SessionRecord
from ..domain.state import SessionState


class SweepPosition(NamedTuple):
    """Where a look spread over passes goes on: the index of the partition it reads, and that partition's
    SSCAN cursor."""

    partition: int = 0
    cursor: int = 0


class Slice(NamedTuple):
    """One read of a partition's sessions: those whose state was wanted, how many states were read, and where
    the next read starts (None once every partition is read)."""

    wanted: list[SessionRecord]
    looked: int
    next: SweepPosition | None


async def slices(store: EventStore, partitions: list[int], wanted: Callable[[SessionState], bool],
                 start: SweepPosition = SweepPosition(), budget: int | None = None) -> AsyncIterator[Slice]:
    """The registered sessions of ``partitions`` whose state is ``wanted``, from ``start``, one slice per read of a
    session set, until about ``budget`` states are read (None: all of them; SSCAN's count is a hint, and a small
    set answers whole). The caller acts on each slice before the next is read."""
    partition, cursor, looked = start.partition, start.cursor, 0
    while partition < len(partitions) and (budget is None or looked < budget):
        if budget is None:
            members, cursor = await directory.registered(store.redis, partitions[partition]), 0
        else:
            cursor, members = await directory.registered_slice(store.redis, partitions[partition], cursor,
                                                               budget - looked)
        records = [r for r in (await store.directory.many(members)).values() if r is not None]
        states = await store.load_many(records)
        looked += len(records)
        if cursor == 0:
            partition += 1
        after = SweepPosition(partition, cursor) if partition < len(partitions) else None
        yield Slice([r for r in records if wanted(states[r.session_id].state)], len(records), after)
