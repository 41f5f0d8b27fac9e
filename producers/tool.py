"""The model-facing send_message tool: strict arguments, the tool definition, results. Pure.

The model supplies exactly ``to``, ``body`` and ``mode``; everything else about
a send (who sends, from which run and tool call) comes from the host.
"""

from collections.abc import Mapping
import json
from typing import Any

from treemail.domain import permissions
from treemail.domain.blocks import text_of
from treemail.domain.commands import SendArguments
from treemail.domain.errors import Code, Rejected
from treemail.domain.results import engine_shutdown, error_result

from . import surface

__all__ = ["TOOL_NAME", "tool_definition", "parse_arguments", "error_result", "engine_shutdown"]

TOOL_NAME = "send_message"
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


def tool_definition(
    rules: list[tuple[str, str]], send_message_tool: bool = True, routing: str = "tree",
    content_blocks: bool = False,
) -> dict | None:
    """The tool for a session, or None when its rules hide it (deny by default).

    With the defaults it is exactly the seed-000 tool; ``routing`` and
    ``content_blocks`` are the deployment's ``[messaging]`` settings.
    """
    if not (send_message_tool and permissions.tool_visible(rules)):
        return None
    to = {"type": "string", "description": "Recipient handle or full session id."}
    body: dict = {"type": "string", "description": "The message, as the recipient should read it."}
    description = DESCRIPTION
    if routing == "direct":
        to, description = surface.direct_routing(to, description)
    if content_blocks:
        body, description = surface.content_blocks(body, description)
    return {
        "name": TOOL_NAME,
        "description": description,
        "input_schema": {
            "type": "object",
            "properties": {
                "to": to,
                "body": body,
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


def parse_arguments(raw: Any, content_blocks: bool = False) -> SendArguments:
    """Strict: the model's JSON object (or its text) with exactly to, body and optionally mode.

    With ``content_blocks`` (the deployment's setting) ``body`` may also be a list of blocks.
    """
    if isinstance(raw, (str, bytes, bytearray)):
        try:
            raw = json.loads(raw)
        except (ValueError, UnicodeDecodeError, RecursionError):
            raise _invalid("arguments are not a JSON object") from None
    if not isinstance(raw, Mapping):
        raise _invalid("arguments must be a JSON object with `to`, `body` and optional `mode`")
    if "recipient_session_id" in raw:
        raise _invalid("`recipient_session_id` was renamed: put the recipient's handle or session id in `to`")
    unknown = sorted(str(k) for k in raw if k not in ALLOWED)
    if unknown:
        raise _invalid(f"unknown argument(s) {', '.join(unknown)}; allowed: to, body, mode")
    blocks = None
    if content_blocks and isinstance(raw.get("body"), list):
        blocks = surface.parse_body_blocks(raw["body"])
        raw = {**raw, "body": text_of(blocks)}
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
    return SendArguments(to=raw["to"].strip(), body=raw["body"], mode=mode, blocks=blocks)
