"""Dead letters: commands no worker will ever decide, set aside with their reason; the producer is told.

The dead-letter stream is for an operator to read, not an archive: it keeps
about ``MAXLEN`` entries, each with at most ``DATA_BYTES`` of the command
(and its full size), so a flood of 10 MB junk cannot fill the server.
"""

import json
from dataclasses import dataclass

from treemail.domain.protocol import PROTOCOL_VERSION
from treemail.adapters import keys, metrics
from treemail.domain.results import clip, engine_shutdown

MAXLEN = 10_000
DATA_BYTES = 4096
DETAIL_CHARS = 300


@dataclass(frozen=True)
class Letter:
    entry_id: bytes | str
    fields: dict
    # A bounded label (it is a metrics label): malformed, invalid, newer_protocol or max_deliveries.
    reason: str
    detail: str = ""
    # What the producer is told, when the entry names whom to tell: (reply list id, answer).
    answer: tuple[str, dict] | None = None


def gave_up(max_deliveries: int) -> dict:
    return engine_shutdown(
        f"the command could not be decided after {max_deliveries} attempts and was set aside for an operator"
    )


async def dead_letter(redis, stream: str, letters: list[Letter], consumer: str) -> None:
    async with redis.pipeline(transaction=False) as pipe:
        for letter in letters:
            data = letter.fields.get(b"__data__", b"")
            if isinstance(data, str):
                data = data.encode("utf-8", "replace")
            pipe.xadd(keys.dead_letters(), {
                "stream": stream, "entry_id": letter.entry_id, "reason": letter.reason,
                "detail": clip(letter.detail, DETAIL_CHARS), "consumer": consumer,
                "data": data[:DATA_BYTES], "size": len(data), "v": PROTOCOL_VERSION,
            }, maxlen=MAXLEN, approximate=True)
            metrics.DEAD_LETTERS.labels(letter.reason).inc()
            if letter.answer is not None:
                reply_to, answer = letter.answer
                pipe.lpush(keys.reply_list(reply_to), json.dumps(answer))
                pipe.expire(keys.reply_list(reply_to), keys.REPLY_TTL_S)
        pipe.xack(stream, keys.COMMAND_GROUP, *[letter.entry_id for letter in letters])
        await pipe.execute()
