"""Command stream entries as the worker reads them: FastStream hooks, and what will never parse."""

import json

from treemail.adapters.codec import parse_command
from treemail.domain import protocol
from treemail.domain.commands import SendMessage


def split_malformed(entries) -> tuple[list[tuple[bytes, SendMessage]], list[tuple[bytes, dict]]]:
    """(entry id, command) for the entries that parse; (entry id, fields) for those that never will."""
    parsed, malformed = [], []
    for entry_id, fields in entries:
        try:
            parsed.append((entry_id, parse_command(fields[b"__data__"])))
        except Exception:  # noqa: BLE001 - anything unreadable is malformed
            malformed.append((entry_id, fields))
    return parsed, malformed


def by_reason(malformed: list[tuple[bytes, dict]]) -> dict[str, list[tuple[bytes, dict]]]:
    """Unreadable entries grouped by why: ``newer_protocol`` (a newer treemail wrote it) or ``malformed``."""
    groups: dict[str, list[tuple[bytes, dict]]] = {}
    for entry_id, fields in malformed:
        try:
            newer = protocol.is_newer(protocol.version_of(json.loads(fields[b"__data__"]).get("v")))
        except Exception:  # noqa: BLE001 - not even JSON
            newer = False
        groups.setdefault("newer_protocol" if newer else "malformed", []).append((entry_id, fields))
    return groups


async def raw_batch(message, original_parser):
    """Parse a batch without touching the bodies: the worker decodes each command once.

    FastStream's default batch parser decodes every body, re-encodes the list
    and decodes it again, which costs more than deciding the command.
    """
    parser = getattr(original_parser, "__self__", None)
    if parser is None:
        return await original_parser(message)
    return parser._build_message(
        raw_message=message, body=b"", path={}, headers={}, batch_headers=[], reply_to="",
        content_type=None, message_id="", correlation_id="",
    )


async def no_body(message, original_decoder):
    return None


def text(value) -> str:
    return value.decode() if isinstance(value, bytes) else value
