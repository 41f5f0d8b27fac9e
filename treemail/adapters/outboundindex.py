"""Reading the outbound index (delivery as an obligation): each partition's hash of send intents and their settlements.

The commit step writes it from the sender's ``MessageSent`` / ``MessageRefused`` /
``MessageSettled`` events, in the same atomic step. Each value says where its record
is on the sender's stream (``domain.outbound.index_entries``); the record is read
from there, so the events stay the truth and the only copy.
"""

import json
from typing import NamedTuple

from redis.asyncio import Redis

from ..domain import events as ev
from ..domain.outbound import index_reference
from . import keys
from .eventstore import decode_entry


class Found(NamedTuple):
    sender_id: str
    partition: int
    # A peer delivery not yet admitted is found by its intent (its status is the source's outbox row).
    sent: ev.MessageSent | ev.MessageRefused | ev.PeerIntentStored
    settled: ev.MessageSettled | None


async def find(redis: Redis, message_id: str, partitions: list[int]) -> Found | None:
    """The sender's record of ``message_id`` and its settlement, from whichever of ``partitions`` holds it."""
    async with redis.pipeline(transaction=False) as pipe:
        for p in partitions:
            pipe.hmget(keys.outbound_index(p), message_id, f"{message_id}:settled")
        replies = await pipe.execute()
    for (raw, settled), partition in zip(replies, partitions):
        if raw is None:
            continue
        if raw.startswith(b"{"):
            return _written_as_copies(message_id, partition, raw, settled)
        sender_id, position = index_reference(raw.decode())
        positions = [position] + ([index_reference(settled.decode())[1]] if settled else [])
        stream = keys.session_stream(partition, sender_id)
        async with redis.pipeline(transaction=False) as pipe:
            for at in positions:
                pipe.xrange(stream, min=f"{at}-0", max=f"{at}-0")
            records = [decode_entry(entries[0][1]) if entries else None for entries in await pipe.execute()]
        if not isinstance(records[0], ev.MessageSent | ev.MessageRefused | ev.PeerIntentStored):
            return None  # its stream no longer holds it (or a newer protocol wrote it): nothing to show
        # A settlement older than the sender's latest record of the message was undone: a revert of the
        # recipient restored the message and wrote the record again (``ProducerMessageRestored``).
        done = records[1] if len(records) > 1 and positions[1] > position else None
        return Found(sender_id, partition, records[0], done if isinstance(done, ev.MessageSettled) else None)
    return None


def _written_as_copies(message_id: str, partition: int, raw: bytes, settled: bytes | None) -> Found:
    """An entry an earlier release wrote: the record's fields themselves, as JSON."""
    sent = json.loads(raw)
    common = {"at": sent["at"], "message_id": message_id, "recipient_session_id": sent["recipient"]}
    record = (ev.MessageRefused(**common, code=sent["code"]) if sent["status"] == "refused" else
              ev.MessageSent(**common, position=sent["position"], recipient_state=sent["recipient_state"]))
    done = json.loads(settled) if settled else None
    return Found(sent["sender"], partition, record, done and ev.MessageSettled(
        at=done["at"], message_id=message_id, recipient_session_id=sent["recipient"], outcome=done["outcome"],
        reason=done["reason"]))
