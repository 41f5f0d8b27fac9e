"""Seed 002 in the send path: the service-wide drain flag.

Read once per round of a batch, beside the states (so a send decided again
after a conflict sees a drain that began meanwhile). A retried tool call is
answered from its idempotency record before this or any other check.
"""

from ..adapters import keys
from ..adapters.eventstore import EventStore


async def service_draining(store: EventStore) -> bool:
    return bool(await store.redis.exists(keys.service_drain()))


async def set_service_drain(store: EventStore, draining: bool) -> None:
    if draining:
        await store.redis.set(keys.service_drain(), "1")
    else:
        await store.redis.delete(keys.service_drain())
