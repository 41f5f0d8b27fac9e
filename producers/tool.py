"""The model-facing send_message tool: strict arguments, the tool definition, results. Pure.

The model supplies exactly ``to``, ``body`` and ``mode``; everything else about
a send (who sends, from which run and tool call) comes from the host.
"""

from collections.abc import Mapping
import json
from typing import Any

from treemail.domain import permissions
from treemail.domain.commands import SendArguments
from treemail.domain.decide.guards import require_body
from treemail.domain.errors import Code, Rejected
from treemail.domain.messaging import MessagingConfig
from treemail.domain.results import clip, engine_shutdown, error_result

__all__ = [
    "TOOL_NAME", "tool_definition", "parse_arguments", "require_storable", "error_result", "engine_shutdown",
    "approval_timeout",
]

TOOL_NAME = "send_message"
SHOWN_KEYS = 5
ALLOWED = {"to", "body", "mode"}
MODES = ("steer", "queue")

DESCRIPTION = (
    "Send a message to another agent in your delegation tree (your parent, your children, or peers "
    "whose handle or session id you were given). `to` is the recipient's handle (like explore_1a2b3c4d) "
    "or full session id. `mode` is `steer` (default: the message joins the recipient's current work at "
    "its next step) or `queue` (it becomes the recipient's next turn). A finished agent is woken by a "
    "message. Success means the message is durably accepted, not that it was read; replies arrive as "
    "new messages, so never poll."
)


def tool_definition(rules: list[tuple[str, str]], send_message_tool: bool = True) -> dict | None:
    """The tool for a session, or None when its rules hide it (deny by default)."""
    if not (send_message_tool and permissions.tool_visible(rules)):
        return None
    return {
        "name": TOOL_NAME,
        "description": DESCRIPTION,
        "input_schema": {
            "type": "object",
            "properties": {
                "to": {"type": "string", "description": "Recipient handle or full session id."},
                "body": {"type": "string", "description": "The message, as the recipient should read it."},
                "mode": {"type": "string", "enum": list(MODES), "default": "steer"},
            },
            "required": ["to", "body"],
            "additionalProperties": False,
        },
    }


def _invalid(message: str) -> Rejected:
    return Rejected(Code.INVALID_ARGUMENTS, message)


def _is_unicode_text(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def parse_arguments(raw: Any) -> SendArguments:
    """Strict: the model's JSON object (or its text) with exactly to, body and optionally mode."""
    if isinstance(raw, (str, bytes, bytearray)):
        try:
            raw = json.loads(raw)
        except (ValueError, UnicodeDecodeError, RecursionError):
            raise _invalid("arguments are not a JSON object") from None
    if not isinstance(raw, Mapping):
        raise _invalid("arguments must be a JSON object with `to`, `body` and optional `mode`")
    if "recipient_session_id" in raw:
        raise _invalid("`recipient_session_id` was renamed: put the recipient's handle or session id in `to`")
    unknown = [k for k in raw if k not in ALLOWED]
    if unknown:
        # Named, but never echoed whole: 100,000 keys must not come back as a 1 MB error.
        shown = ", ".join(clip(str(k), 40) for k in sorted(unknown[:SHOWN_KEYS * 4], key=str)[:SHOWN_KEYS])
        more = f" and {len(unknown) - SHOWN_KEYS} more" if len(unknown) > SHOWN_KEYS else ""
        raise _invalid(f"unknown argument(s) {shown}{more}; allowed: to, body, mode")
    for name in ("to", "body"):
        if name not in raw:
            raise _invalid(f"missing required argument `{name}`")
        if not isinstance(raw[name], str):
            raise _invalid(f"`{name}` must be a string")
        if not _is_unicode_text(raw[name]):
            # A JSON "\ud800" escape decodes to a lone surrogate, which no UTF-8 store or byte count accepts.
            raise _invalid(f"`{name}` is not valid Unicode text (it contains a lone surrogate)")
    mode = raw.get("mode", "steer")
    if mode not in MODES:
        raise _invalid("`mode` must be \"steer\" or \"queue\"")
    if not raw["to"].strip():
        raise _invalid("`to` is empty: give the recipient's handle or session id")
    return SendArguments(to=raw["to"].strip(), body=raw["body"], mode=mode)


def require_storable(arguments: SendArguments, config: MessagingConfig) -> None:
    """Refuse, before anything is stored, a body every worker would refuse for its size.

    The decision checks it again (a worker may run another configuration);
    this check only keeps a 10 MB body out of the command stream. Messaging
    that is disabled is left to the decision, whose code says so.
    """
    if config.enabled and arguments.body:
        require_body(arguments.body, config.max_body_bytes)


def approval_timeout(request_id: str, waited_s: float) -> dict:
    return error_result(
        Code.APPROVAL_TIMEOUT.value,
        f"nobody answered approval request {request_id} within {waited_s:g} s, so nothing was sent. The "
        "request stays open: if a person approves it later, retrying this same tool call sends the message.",
    )
