"""Model-facing ``inspect_message``, ``retry_message`` and ``cancel_message`` tools (a sender follows its own mail,
and takes it back); a host installs any of them, or none.

Like send_message, the caller's identity comes from the host's context
(``SendContext.session_id``), never from the arguments, and every answer is
a result or ``{"error": {"code", "message"}}``; nothing a model sends raises.

    definition = message_tools.tool_definition("inspect_message")
    result = await message_tools.handle(tm.obligations, "inspect_message", ctx, {"message_id": ...})
"""

import json
from collections.abc import Mapping
from typing import Any, Protocol

from treemail.domain.commands import SendContext
from treemail.domain.errors import Code, InvalidRequest
from treemail.domain.results import error_result


DESCRIPTIONS = {
    "inspect_message": (
        "See what became of a message you sent: `pending` (a peer message stored and not yet admitted by its "
        "peer; with its attempts), `accepted` (stored for its recipient; with how many delivery "
        "attempts failed and why), `processed` (the recipient consumed it, or it was discarded and why), "
        "`parked` (delivery stopped after repeated failures or its deadline; retry_message can restart it) or "
        "`refused`. Give the `message_id` that send_message (or send_to_peer) returned. Accepted does not mean read. A `stranded` reason on a message means its "
        "recipient closed with it pending and no one will take it: cancel_message ends it."
    ),
    "retry_message": (
        "Restart delivery of a parked message you sent (inspect_message says `parked`). A processed or "
        "refused message cannot be retried: send a new one instead."
    ),
    "cancel_message": (
        "Take back a message you sent: `cancelled` if the recipient has not received it yet (it never will), "
        "`already_delivered` if it has. Give the `message_id` that send_message returned."
    ),
}
TOOL_NAMES = tuple(DESCRIPTIONS)


def tool_definition(name: str) -> dict:
    return {
        "name": name,
        "description": DESCRIPTIONS[name],
        "input_schema": {
            "type": "object",
            "properties": {"message_id": {"type": "string", "description": "The message_id send_message returned."}},
            "required": ["message_id"],
            "additionalProperties": False,
        },
    }


def parse_arguments(raw: Any) -> str | dict:
    """The message id, or the invalid_arguments error to return."""
    if isinstance(raw, (str, bytes, bytearray)):
        try:
            raw = json.loads(raw)
        except (ValueError, UnicodeDecodeError, RecursionError):
            raw = None
    if not isinstance(raw, Mapping) or set(raw) != {"message_id"} or not isinstance(raw["message_id"], str) \
            or not raw["message_id"].strip():
        return error_result(Code.INVALID_ARGUMENTS.value, "arguments must be exactly {\"message_id\": \"<id>\"}")
    return raw["message_id"].strip()


class Inspector(Protocol):
    """What the two tools call: ``tm.obligations`` (``producers/host/obligations.py``)."""

    async def inspect(self, message_id: str, caller_session_id: str | None = None) -> dict: ...

    async def retry(self, message_id: str, caller_session_id: str | None = None) -> dict: ...

    async def cancel(self, message_id: str, caller_session_id: str | None = None) -> dict: ...


async def handle(inspector: Inspector, name: str, context: SendContext, arguments: Any) -> dict:
    """Run the tool ``name`` for the session in ``context``."""
    if name not in DESCRIPTIONS:
        raise InvalidRequest(Code.UNKNOWN_TOOL.value, f"unknown message tool {name!r}; one of {', '.join(TOOL_NAMES)}")
    message_id = parse_arguments(arguments)
    if isinstance(message_id, dict):
        return message_id
    action = {"inspect_message": inspector.inspect, "retry_message": inspector.retry,
              "cancel_message": inspector.cancel}[name]
    return await action(message_id, context.session_id)


def render(status: dict) -> str:
    """One line per fact, for `treemail inspect` (errors are one line too)."""
    if "error" in status:
        return f"{status['error']['code']}: {status['error']['message']}"
    lines = [f"{status['message_id']}  {status['status']}"]
    receipt = status.get("receipt")
    if receipt:
        lines.append(f"  to {receipt['recipient_session_id']} at position {receipt['position']} "
                     f"({receipt['recipient_state']} at acceptance)")
        history = [f"{label} {receipt[key]}" for key, label in (("sequence", "number"), ("caused_by", "caused by"),
                                                                 ("chain_id", "chain"), ("trace_id", "trace"))
                   if receipt.get(key) is not None]
        if history:
            lines.append("  " + ", ".join(history))
    elif status.get("recipient_session_id"):
        lines.append(f"  to {status['recipient_session_id']}")
    for key in ("delivery", "attempts", "reason", "stranded", "next_attempt_at", "deadline_at"):
        if status.get(key) is not None:
            lines.append(f"  {key}: {status[key]}")
    if status.get("settlement"):
        lines.append(f"  settlement: {status['settlement']['outcome']} {status['settlement']['reason']}".rstrip())
    return "\n".join(lines)
