"""Seed 002 in the send path: the service-wide drain flag.

Read once per fresh round of a batch, beside the states (so a send decided
again after a conflict sees a drain that began meanwhile), and checked again
by the commit step against the partition's copy (a send accepted after the
drain began is a conflict). A retried tool call is answered from its
idempotency record before this or any other check.
"""

from ..adapters import keys
from ..adapters.eventstore import EventStore


async def service_draining(store: EventStore) -> bool:
    return bool(await store.redis.exists(keys.service_drain()))


async def set_service_drain(store: EventStore, draining: bool) -> None:
    """The flag, and its copy on every partition's slot, which a send's commit checks atomically.

    The copies are set before the flag and cleared after it, so a decision that read the flag
    never commits against copies that disagree with it for longer than this call."""
    partitions = [keys.partition_drain(p) for p in range(store.config.partitions)]
    async with store.redis.pipeline(transaction=False) as pipe:
        if draining:
            for key in partitions:
                pipe.set(key, "1")
            pipe.set(keys.service_drain(), "1")
        else:
            pipe.delete(keys.service_drain())
            for key in partitions:
                pipe.delete(key)
        await pipe.execute()
