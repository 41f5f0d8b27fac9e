"""The service-wide drain flag: set and cleared by the host, read by every send decision.

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

    The copies are set before the flag and cleared after it, in two round trips (a cluster keeps no
    order between the nodes of one pipeline): a decision that read the flag as set never meets a clear
    copy, and one that read it clear meets a set copy only while this call runs (a conflict: it is
    decided again)."""
    if draining:
        await _set_copies(store, True)
        await store.redis.set(keys.service_drain(), "1")
    else:
        await store.redis.delete(keys.service_drain())
        await _set_copies(store, False)


async def _set_copies(store: EventStore, draining: bool) -> None:
    async with store.redis.pipeline(transaction=False) as pipe:
        for key in (keys.partition_drain(p) for p in range(store.config.partitions)):
            if draining:
                pipe.set(key, "1")
            else:
                pipe.delete(key)
        await pipe.execute()
