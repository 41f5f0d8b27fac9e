"""Seed 002 in the send path: the service-wide drain flag, and outcomes a late refusal must not hide.

Both are read only where the decision needs them: the flag once per round
(with the states, so a send decided again after a conflict sees a drain that
began meanwhile), the idempotency records only for the few refusals that
``idempotency.answers_from_record_first`` names.
"""

import json

from ..adapters import keys
from ..adapters.eventstore import EventStore
from ..domain.commands import SendMessage
from ..domain.decide import idempotency
from ..domain.records import SessionRecord


async def service_draining(store: EventStore) -> bool:
    return bool(await store.redis.exists(keys.service_drain()))


async def set_service_drain(store: EventStore, draining: bool) -> None:
    if draining:
        await store.redis.set(keys.service_drain(), "1")
    else:
        await store.redis.delete(keys.service_drain())


async def answer_from_records(
    store: EventStore, refused: list[tuple[SendMessage, SessionRecord]], outcomes: dict[str, dict]
) -> None:
    """A tool call refused now, whose earlier decision was recorded (say, accepted before its run ended),
    is answered with that record."""
    if not refused:
        return
    async with store.redis.pipeline(transaction=False) as pipe:
        for command, sender in refused:
            pipe.get(keys.idempotency(sender.partition, idempotency.key_digest(command.context)))
        records = await pipe.execute()
    for (command, _), raw in zip(refused, records):
        if raw is not None:
            outcomes[command.command_id] = idempotency.replayed_outcome(json.loads(raw), command.arguments)
