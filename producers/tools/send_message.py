"""The model-facing send_message tool: strict arguments, the tool definition, results. Pure.

The model supplies exactly ``to``, ``body`` and ``mode``; everything else about
a send (who sends, from which run and tool call) comes from the host.
"""

from typing import Any

from treemail.domain import effective
from treemail.domain.commands import SendArguments
from treemail.domain.decide.sendfields import (
    EXPIRES, MODES, SUPERSEDE, URGENT, invalid, is_unicode_text, require_storable, send_fields,
)
from treemail.domain.results import approval_timeout, engine_shutdown, error_result

from . import arguments, surface

__all__ = [
    "TOOL_NAME", "tool_definition", "parse_arguments", "require_storable", "result_text", "error_result",
    "engine_shutdown", "approval_timeout",
]

TOOL_NAME = "send_message"
SHOWN_KEYS = 5
ALLOWED = ("to", "body", "mode")
# Threads (host-enabled, ``[messaging] threads``): the one optional argument they add.
IN_REPLY_TO = "in_reply_to"
THREAD_ARGUMENT = "The message_id of a message you received and are answering: your message joins its thread."
THREAD_DESCRIPTION = " To answer a message you received, give its message_id as `in_reply_to`."
# Expiry and supersede (host-enabled, ``[messaging] mail_control``): the two optional arguments they add.
MAIL_CONTROL_ARGUMENTS = {
    EXPIRES: {"type": "number", "exclusiveMinimum": 0, "maximum": 604800,
              "description": "Seconds after which the message is useless: unread by then, it is never delivered."},
    SUPERSEDE: {"type": "string", "minLength": 1, "maxLength": 200,
                "description": "A name for what the message is about (like `progress`): it replaces your earlier "
                               "unread message to the same recipient with the same name."},
}
MAIL_CONTROL_DESCRIPTION = (" A message that is useless after a while can carry `expires_in_s`; one that replaces your "
                            "earlier unread one on the same subject, a `supersede_key`.")
# Order and priority (host-enabled per session): the one optional argument it adds.
URGENT_ARGUMENT = ("true: the recipient reads this message ahead of its other waiting mail. Only for what must "
                   "change its work now; ordinary mail is never held back by more than a few urgent messages.")

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
    content_blocks: bool = False, overlay: list[tuple[str, str]] | tuple = (), threads: bool = False,
    mail_control: bool = False, urgent: bool = False,
) -> dict | None:
    """The tool for a session, or None when its rules (under the host's overlay, if any) hide it.

    With the defaults it is exactly the plain send_message tool; ``routing`` and
    ``content_blocks`` are the deployment's ``[messaging]`` settings.
    """
    if not effective.visibility(rules, send_message_tool, overlay).visible:
        return None
    to = {"type": "string", "minLength": 1, "description": "Recipient handle or full session id."}
    body: dict = {"type": "string", "minLength": 1, "description": "The message, as the recipient should read it."}
    description = DESCRIPTION
    if routing == "direct":
        to, description = surface.direct_routing(to, description)
    if content_blocks:
        body, description = surface.content_blocks(body, description)
    properties = {"to": to, "body": body, "mode": {"type": "string", "enum": list(MODES), "default": "steer"}}
    if threads:
        properties[IN_REPLY_TO] = {"type": "string", "minLength": 1, "description": THREAD_ARGUMENT}
        description += THREAD_DESCRIPTION
    if mail_control:
        properties.update(MAIL_CONTROL_ARGUMENTS)
        description += MAIL_CONTROL_DESCRIPTION
    if urgent:
        properties[URGENT] = {"type": "boolean", "default": False, "description": URGENT_ARGUMENT}
    return {
        "name": TOOL_NAME,
        "description": description,
        "input_schema": {
            "type": "object",
            "properties": properties,
            "required": ["to", "body"],
            "additionalProperties": False,
        },
    }


def parse_arguments(raw: Any, content_blocks: bool = False, threads: bool = False,
                    mail_control: bool = False, urgent: bool = False) -> SendArguments:
    """Strict: the model's JSON object (or its text) with exactly to, body and optionally mode.

    With ``content_blocks`` (the deployment's setting) ``body`` may also be a list of blocks; with
    ``threads``, ``in_reply_to`` may name the message it answers (the host checks and threads it); with
    ``mail_control``, ``expires_in_s`` and ``supersede_key`` are the send options a host may also give; with
    ``urgent`` (the host enabled it for the sender), ``urgent`` may mark it urgent.

    The object's shape is judged here, which keys it may have; its fields are then handed down once to
    the domain's ``send_fields``, which judges them in the order a model reads its mistakes.
    """
    raw = arguments.json_object(raw, invalid, "`to`, `body` and optional `mode`")
    if "recipient_session_id" in raw:
        raise invalid("`recipient_session_id` was renamed: put the recipient's handle or session id in `to`")
    allowed = (*ALLOWED, *((IN_REPLY_TO,) if threads else ()), *((EXPIRES, SUPERSEDE) if mail_control else ()),
               *((URGENT,) if urgent else ()))
    arguments.refuse_unknown(raw, allowed, invalid)
    if not isinstance(raw.get(URGENT, False), bool):
        raise invalid("`urgent` must be true or false")
    in_reply_to = raw.get(IN_REPLY_TO)
    if in_reply_to is not None and not (isinstance(in_reply_to, str) and in_reply_to.strip()
                                        and is_unicode_text(in_reply_to) and len(in_reply_to) <= 200):
        raise invalid("`in_reply_to` must be the message_id of a message you received")
    return send_fields(raw, content_blocks, in_reply_to)


# ---- what the model reads --------------------------------------------------------------------

_AFTER = {
    ("running", "steer"): "the recipient is running and reads it at its next step",
    ("running", "queue"): "the recipient is running; the message becomes its next turn",
    ("queued", "steer"): "the recipient is not running now and reads it when its next run starts",
    ("queued", "queue"): "the recipient is not running now and reads it when its next run starts",
    ("waking_finished", "steer"): "the recipient had finished and is woken with the message as its input",
    ("waking_finished", "queue"): "the recipient had finished and is woken with the message as its input",
}


def result_text(result: dict) -> str:
    """The tool-result text a model reads, one line: the accepted state, or ``code: message``.

    Every adapter (host API, MCP, framework bindings) renders a send_message
    result with this function, so every model reads the same words. The one
    multi-line text is the unknown-reference error: its candidate list follows,
    one peer a line, after the ``code: message`` line.
    """
    error = result.get("error")
    if error is not None:
        return f"{error['code']}: {error['message']}"
    state, mode = result["recipient_state"], result["mode"]
    after = _AFTER.get((state, mode), "it is delivered at the recipient's next safe step")
    return (
        f"send_message accepted: message_id={result['message_id']} mode={mode} recipient_state={state}; "
        f"durably accepted, not yet read: {after}. Replies arrive as new messages; do not poll."
    )
