"""The model-facing interrupt_agent tool: strict arguments, the definition. Pure.

The second control tool beside send_message: a thin adapter; who may
interrupt whom is decided behind it (``domain/decide/interrupt.py``). The
model supplies ``to`` and an optional ``reason``; who interrupts, from which
run and tool call, comes from the host.
"""

from collections.abc import Mapping
from typing import Any

from treemail.domain import actions, limits
from treemail.domain.commands import InterruptArguments
from treemail.domain.errors import Code, Rejected

from . import arguments

TOOL_NAME = "interrupt_agent"
ALLOWED = ("to", "reason")
MAX_REASON_BYTES = limits.MAX_REASON_BYTES

DESCRIPTION = (
    "Interrupt the current run of a direct neighbour: your direct child, or your direct parent when you are a "
    "resident continuable child. The run stops at its next step; the agent keeps its history and can be sent "
    "more work with send_message. Interrupting an agent that is not running does nothing. Returns whether an "
    "interrupt was requested, not the agent's answer."
)


def tool_definition(interrupt_rules: list[tuple[str, str]]) -> dict | None:
    """The tool for a session, or None without an allowing ``interrupt`` rule (deny by default)."""
    if not actions.interrupt_visible(interrupt_rules):
        return None
    return {
        "name": TOOL_NAME,
        "description": DESCRIPTION,
        "input_schema": {
            "type": "object",
            "properties": {
                "to": {"type": "string", "description": "The agent's handle or full session id."},
                "reason": {"type": "string", "description": "Why, in a sentence; the interrupted agent's host sees it."},
            },
            "required": ["to"],
            "additionalProperties": False,
        },
    }


def _invalid(message: str) -> Rejected:
    return Rejected(Code.INTERRUPT_INVALID_ARGUMENTS, message)


def _text(raw: Mapping, name: str) -> str:
    value = raw[name]
    if not isinstance(value, str):
        raise _invalid(f"`{name}` must be a string")
    try:
        size = len(value.encode("utf-8"))
    except UnicodeEncodeError:
        raise _invalid(f"`{name}` is not valid Unicode text (it contains a lone surrogate)") from None
    if name == "reason" and size > MAX_REASON_BYTES:
        raise _invalid(f"`reason` is {size} bytes; at most {MAX_REASON_BYTES}")
    return value


def parse_arguments(raw: Any) -> InterruptArguments:
    """Strict: the model's JSON object (or its text) with exactly ``to`` and optionally ``reason``."""
    raw = arguments.json_object(raw, _invalid, "`to` and optional `reason`")
    arguments.refuse_unknown(raw, ALLOWED, _invalid)
    if "to" not in raw:
        raise _invalid("missing required argument `to`")
    to = _text(raw, "to").strip()
    if not to:
        raise _invalid("`to` is empty: give the agent's handle or session id")
    return InterruptArguments(to=to, reason=_text(raw, "reason") if "reason" in raw else "")
