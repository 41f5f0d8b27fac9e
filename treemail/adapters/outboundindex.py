"""Reading the outbound index (delivery as an obligation): each partition's hash of send intents and their settlements.

The commit step writes it from the sender's ``MessageSent`` / ``MessageRefused`` /
``MessageSettled`` events, in the same atomic step. Each value says where its record
is on the sender's stream (``domain.outbound.index_entries``); the record is read
from there, so the events stay the truth and the only copy. Stored in binary
(``compact``); what earlier versions wrote (text, or copies as JSON) still reads.
"""

import json
from typing import NamedTuple

from redis.asyncio import Redis

from ..domain import events as ev
from ..domain.outbound import index_reference
from . import compact, keys
from .eventstore import decode_entry


class Found(NamedTuple):
    sender_id: str
    partition: int
    # A peer delivery not yet admitted is found by its intent (its status is the source's outbox row).
    sent: ev.MessageSent | ev.MessageRefused | ev.PeerIntentStored
    settled: ev.MessageSettled | None


async def reference(redis: Redis, partition: int, message_id: str) -> tuple[str, int] | None:
    """(sender, position of its record) of the message's entry in the partition's index, or None."""
    compact_field, _ = compact.outbound_fields(message_id)
    raw, old = await redis.hmget(keys.outbound_index(partition), compact_field, message_id)
    if raw is not None:
        return compact.decode_outbound(raw)
    return index_reference(old.decode()) if old is not None and not old.startswith(b"{") else None


async def find(redis: Redis, message_id: str, partitions: list[int]) -> Found | None:
    """The sender's record of ``message_id`` and its settlement, from whichever of ``partitions`` holds it."""
    fields = (*compact.outbound_fields(message_id), message_id, f"{message_id}:settled")
    async with redis.pipeline(transaction=False) as pipe:
        for p in partitions:
            pipe.hmget(keys.outbound_index(p), *fields)
        replies = await pipe.execute()
    for (raw, settled, old, old_settled), partition in zip(replies, partitions):
        if raw is not None:  # the stored form (``compact``)
            sender_id, position = compact.decode_outbound(raw)
        elif old is None:
            continue
        elif old.startswith(b"{"):
            return _written_as_copies(message_id, partition, old, old_settled)
        else:  # an earlier version's text: "<sender> <position>"
            sender_id, position = index_reference(old.decode())
        # A message sent before an upgrade may be settled after it: either form of the settlement counts.
        done_at = (compact.decode_outbound(settled)[1] if settled is not None else
                   index_reference(old_settled.decode())[1] if old_settled is not None else None)
        positions = [position] + ([done_at] if done_at is not None else [])
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
