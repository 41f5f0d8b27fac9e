"""The model-facing message_subtree tool: strict arguments, the definition, the result line. Pure.

Installed by the host one session at a time (off by default). One call sends
the same message to every agent below the caller; each copy is an ordinary
send_message under every guard, so a copy can be refused while the others
arrive: the result lists both.
"""

from collections.abc import Mapping
from typing import Any

from treemail.domain.errors import Code, Rejected

from . import arguments

TOOL_NAME = "message_subtree"
ALLOWED = ("body", "mode")

DESCRIPTION = (
    "Send one message to every agent below you: your children, their children, and so on (those that exist "
    "now). Each copy is delivered like send_message: a working agent receives it at its next step, an idle one "
    "starts a new turn with it. Some copies can be refused (a full inbox, no permission) while the others "
    "arrive; the result says which. Returns delivery confirmations, not the agents' answers."
)


def tool_definition() -> dict:
    return {
        "name": TOOL_NAME,
        "description": DESCRIPTION,
        "input_schema": {
            "type": "object",
            "properties": {
                "body": {"type": "string", "description": "The message, as each agent below you will read it."},
                "mode": {"type": "string", "enum": ["steer", "queue"],
                         "description": "steer (default): at each agent's next step; queue: as a new turn."},
            },
            "required": ["body"],
            "additionalProperties": False,
        },
    }


def _invalid(message: str) -> Rejected:
    return Rejected(Code.SUBTREE_INVALID_ARGUMENTS, message)


def parse_arguments(raw: Any) -> tuple[str, str]:
    """Strict: ``body`` (a string) and optionally ``mode``; the body's size is the broadcast's to judge."""
    raw: Mapping = arguments.json_object(raw, _invalid, "`body` and optional `mode`")
    arguments.refuse_unknown(raw, ALLOWED, _invalid)
    if "body" not in raw:
        raise _invalid("missing required argument `body`")
    if not isinstance(raw["body"], str):
        raise _invalid("`body` must be a string")
    mode = raw.get("mode", "steer")
    if mode not in ("steer", "queue"):
        raise _invalid("`mode` must be steer or queue")
    return raw["body"], mode


def result_text(result: dict) -> str:
    return result.get("message") or f"message_subtree: {result.get('result')}"
