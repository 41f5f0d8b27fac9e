"""Command stream entries as the worker reads them: FastStream hooks, and what will never be decided."""

from treemail.adapters.codec import InvalidCommand, parse_command
from treemail.domain import protocol
from treemail.domain.commands import SendMessage
from treemail.domain.errors import Code
from treemail.domain.results import error_result

from .deadletters import Letter


def split_malformed(entries) -> tuple[list[tuple[bytes, SendMessage]], list[Letter]]:
    """(entry id, command) for the entries that parse; a dead letter for each of the others, checked alone.

    One entry that is not a command (not JSON; or JSON with ``to=123``,
    ``mode="bogus"``) must not fail the batch it came in: it is set aside at
    once with its reason, and answered when it says whom to answer. A command
    a newer treemail wrote is set aside too (``newer_protocol``): deciding what
    this version may misread would be worse than waiting for an upgrade.
    """
    parsed, unreadable = [], []
    for entry_id, fields in entries:
        try:
            parsed.append((entry_id, parse_command(fields[b"__data__"])))
        except protocol.NewerProtocol as newer:
            unreadable.append(Letter(entry_id, fields, "newer_protocol", str(newer), _newer_answer(fields, newer)))
        except InvalidCommand as invalid:
            answer = None
            if invalid.command_id and invalid.reply_to:
                answer = (invalid.reply_to, {"command_id": invalid.command_id, **error_result(
                    Code.INVALID_ARGUMENTS.value,
                    f"the message service could not read this send ({invalid.reason}); it was not sent",
                )})
            unreadable.append(Letter(entry_id, fields, "invalid", invalid.reason, answer))
        except Exception as exc:  # noqa: BLE001 - anything unreadable is malformed
            unreadable.append(Letter(entry_id, fields, "malformed", f"{type(exc).__name__}: {exc}"))
    return parsed, unreadable


def _newer_answer(fields: dict, newer: protocol.NewerProtocol) -> tuple[str, dict] | None:
    try:
        command = parse_command(fields[b"__data__"], check_version=False)
    except Exception:  # noqa: BLE001 - nobody to answer
        return None
    return command.reply_to, {"command_id": command.command_id, **error_result(
        Code.ENGINE_SHUTDOWN.value,
        f"{newer}; it was set aside, not decided: retrying this same tool call once the workers are upgraded "
        "is safe",
    )}


async def raw_batch(message, original_parser):
    """Parse a batch without touching the bodies: the worker decodes each command once.

    FastStream's default batch parser decodes every body, re-encodes the list
    and decodes it again, which costs more than deciding the command.
    """
    parser = getattr(original_parser, "__self__", None)
    if parser is None:
        return await original_parser(message)
    # The batch's first entry id names it: without an id FastStream makes a uuid4 for every batch.
    first = text(message["message_ids"][0]) if message.get("message_ids") else "batch"
    return parser._build_message(
        raw_message=message, body=b"", path={}, headers={}, batch_headers=[], reply_to="",
        content_type=None, message_id=first, correlation_id=first,
    )


async def no_body(message, original_decoder):
    return None


def text(value) -> str:
    return value.decode() if isinstance(value, bytes) else value
