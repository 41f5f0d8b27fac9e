"""`treemail tail`: a session's ProducerMessage* rows, live, optionally replayed from the start first.

Rows come from ``render.history_row``, which depends only on the event and its
position, so a row tailed live and the same row replayed later are identical.
"""

from collections.abc import AsyncIterator

from treemail.adapters import keys
from treemail.adapters.eventstore import EventStore, decode_entry
from treemail.domain import events as ev
from treemail.domain.records import SessionRecord

from .render import history_row


def mail_row(seq: int, event: ev.Event | None) -> str | None:
    if event is None or not type(event).__name__.startswith("ProducerMessage"):
        return None
    return history_row(seq, event)


async def tail(store: EventStore, record: SessionRecord, from_start: bool = False,
               block_ms: int = 1000) -> AsyncIterator[str]:
    stream = keys.session_stream(record.partition, record.session_id)
    if from_start:
        after = "0-0"
    else:
        last = await store.redis.xrevrange(stream, count=1)
        after = last[0][0].decode() if last else "0-0"
    while True:
        replies = await store.redis.xread({stream: after}, count=500, block=block_ms)
        for _, entries in replies or []:
            for entry_id, fields in entries:
                after = entry_id.decode()
                row = mail_row(int(after.split("-")[0]), decode_entry(fields))
                if row is not None:
                    yield row
