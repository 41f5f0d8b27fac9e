"""Model-facing ``read_receipt``: has the recipient read my messages? A host installs it.

The pair is always (the caller, ``to``): identity comes from the host's
context, so a model reads the receipt of its own mail and nobody else's.
``to`` is a handle of the caller's tree or a full session id, as in
send_message.
"""

import json
from typing import Any

from treemail.domain import ids
from treemail.domain.errors import Code
from treemail.domain.results import error_result

TOOL_NAME = "read_receipt"
FIELDS = {"to", "sequence"}


def tool_definition() -> dict:
    return {
        "name": TOOL_NAME,
        "description": (
            "Check whether an agent has read the messages you sent it. `to` is its handle or session id. "
            "Every send_message result carries a `sequence` number; give it as `sequence` to ask whether that "
            "message and every one you sent it before have been read. The answer says how far it has read "
            "(`consumed_through`) and how many you have sent it (`sent_through`). Do not poll: check once when "
            "what you do next depends on it."
        ),
        "input_schema": {
            "type": "object",
            "properties": {
                "to": {"type": "string", "minLength": 1, "description": "Recipient handle or full session id."},
                "sequence": {"type": "integer", "minimum": 1,
                             "description": "The `sequence` of one of your send_message results."},
            },
            "required": ["to"],
            "additionalProperties": False,
        },
    }


def parse_arguments(raw: Any) -> tuple[str, int | None] | dict:
    """(to, sequence), or the invalid_arguments error to return."""
    if isinstance(raw, (str, bytes, bytearray)):
        try:
            raw = json.loads(raw)
        except (ValueError, UnicodeDecodeError, RecursionError):
            raw = None
    invalid = Code.RECEIPT_INVALID_ARGUMENTS.value
    if not isinstance(raw, dict) or set(raw) - FIELDS:
        return error_result(invalid, "arguments are `to` and optional `sequence`")
    to, sequence = raw.get("to"), raw.get("sequence")
    if not isinstance(to, str) or not to.strip() or len(to) > 200:
        return error_result(invalid, "`to` must be the recipient's handle or session id")
    if sequence is not None and (isinstance(sequence, bool) or not isinstance(sequence, int) or sequence < 1):
        return error_result(invalid, "`sequence` must be a positive whole number from a send_message result")
    return to.strip(), sequence


def result_text(result: dict) -> str:
    read = result.get("read")
    head = "" if read is None else ("read: " if read else "not read yet: ")
    return (f"{head}{result['to']} has read your messages through {result['consumed_through']} "
            f"of {result['sent_through']} you sent it.")


async def call(history, reader, context, arguments) -> dict:
    """The tool's call through the host's history part; ``reader`` names the caller's tree peers."""
    parsed = parse_arguments(arguments)
    if isinstance(parsed, dict):
        return parsed
    to, sequence = parsed
    sender = await reader.find(context.session_id)
    recipient = None
    if sender is not None and ids.is_uuid(to):
        recipient = await reader.find(to)
    elif sender is not None:
        recipient = next((peer.record for peer in await reader.tree_peers(sender)
                          if peer.record.handle == to), None)
    if recipient is None:
        return error_result(Code.RECEIPT_UNKNOWN_RECIPIENT.value,
                            f"no agent {to!r}: give the handle or session id you sent your messages to")
    receipt = await history.read_receipt(context.session_id, recipient.session_id)
    result = {"to": recipient.address, "sent_through": receipt["sent_through"],
              "consumed_through": receipt["consumed_through"]}
    if sequence is not None:
        result["read"] = receipt["consumed_through"] >= sequence
    return result
