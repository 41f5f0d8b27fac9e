"""Dead letters: commands no worker will ever decide, set aside with their reason; the producer is told."""

import json

from treemail import PROTOCOL_VERSION
from treemail.adapters import keys, metrics
from treemail.adapters.codec import parse_command
from treemail.domain import protocol
from treemail.domain.errors import Code
from treemail.domain.results import engine_shutdown, error_result


def _answer(reason: str, data: bytes, max_deliveries: int) -> dict:
    if reason == "newer_protocol":
        version = protocol.version_of(json.loads(data).get("v"))
        return error_result(
            Code.ENGINE_SHUTDOWN.value,
            f"{protocol.NewerProtocol(version, 'this command')}; it was set aside, not decided: "
            "retrying this same tool call once the workers are upgraded is safe",
        )
    return engine_shutdown(
        f"the command could not be decided after {max_deliveries} attempts and was set aside for an operator"
    )


async def dead_letter(redis, stream: str, entries: list, reason: str, consumer: str, max_deliveries: int) -> None:
    async with redis.pipeline(transaction=False) as pipe:
        for entry_id, fields in entries:
            pipe.xadd(keys.dead_letters(), {
                "stream": stream, "entry_id": entry_id, "reason": reason,
                "consumer": consumer, "data": fields.get(b"__data__", b""), "v": PROTOCOL_VERSION,
            })
            metrics.DEAD_LETTERS.labels(reason).inc()
            try:
                command = parse_command(fields[b"__data__"], check_version=False)
            except Exception:  # noqa: BLE001 - an unparsable command has nobody to answer
                continue
            answer = _answer(reason, fields[b"__data__"], max_deliveries)
            pipe.lpush(keys.reply_list(command.reply_to), json.dumps({"command_id": command.command_id, **answer}))
        pipe.xack(stream, keys.COMMAND_GROUP, *[entry_id for entry_id, _ in entries])
        await pipe.execute()
