"""The model-facing peer tools (peer routes across trees): send_to_peer, reply_to_peer, peer_inbox. Pure.

Three separate tools a host installs one by one. Each definition is built
from what the calling session's peer routes and grants allow, and is None
when they allow nothing (deny by default). A model names a peer, never a
session, principal or return address: those come from the routes the host
registered and from the host's context.

A little over the house's 200 lines: the three peer tools' definitions and strict argument parsers.
"""

import json
from collections.abc import Collection, Mapping
from datetime import datetime, timezone
from typing import Any

from treemail.domain.commands import PeerSendArguments
from treemail.domain.errors import Code, Rejected
from treemail.domain.peers import INBOX_LIMIT, InboxEntry

from . import arguments

SEND_TOOL = "send_to_peer"
REPLY_TOOL = "reply_to_peer"
INBOX_TOOL = "peer_inbox"
MODES = ("steer", "queue")
MAX_SCHEMA_CHARS = 2000
MAX_REFERENCE_CHARS = 128

SEND_DESCRIPTION = (
    "Send a message to an independent agent over a peer route your host set up. `peer` is one of the names "
    "listed below; no other agent can be reached this way. `mode` is `steer` (default: the message joins the "
    "peer's current work at its next step) or `queue` (it becomes the peer's next turn). `in_reply_to` may carry "
    "a message id for correlation only; to answer a message you received, use reply_to_peer. Success means the "
    "message is stored for delivery (`status: pending`), not that it arrived or was read; treemail delivers it "
    "to the peer and retries if needed. Answers arrive as new messages, so never poll."
)
REPLY_DESCRIPTION = (
    "Reply to a message another agent sent you over a peer route. `message_id` is that message's id, as your "
    "peer_inbox (or the message's envelope) shows it, and `peer` the name of your route to its sender, which "
    "must be the agent that sent it. Receiving a message does not by itself let you answer it: only the peers "
    "listed below can be replied to, and only about a message they sent you."
)
INBOX_DESCRIPTION = (
    "List the latest messages other agents sent you over peer routes, newest first, from the peers you may read: "
    "each with its message_id, its sender, the principal it was delivered as, when it arrived, and `reply_peer`, "
    "the peer name to answer it with reply_to_peer (null when you have no route back to that sender). When "
    "`next_cursor` is not null, pass it as `cursor` to read the next page. A message from a sender you may not "
    "read shows only its message_id, when it arrived and an `error` (peer_message:not_granted)."
)
WITHHELD = "you hold no read grant on this message's sender: its sender and provenance are not shown"


def _peer_lines(views) -> str:
    lines = []
    for view in views:
        line = f"- `{view.name}`"
        if view.allows("context"):
            line += f" — {view.route.description or view.target.description} — {view.status}"
            if view.route.input_schema is not None:
                schema = json.dumps(view.route.input_schema, separators=(",", ":"), ensure_ascii=False)
                schema = schema if len(schema) <= MAX_SCHEMA_CHARS else schema[:MAX_SCHEMA_CHARS] + "…"
                line += f"; `body` is a JSON object matching {schema}"
        lines.append(line)
    return "\n".join(lines)


def _body_schema(views) -> dict:
    structured = any(v.route.input_schema is not None for v in views)
    text = "The message, as the peer should read it"
    if structured:
        return {"type": ["string", "object"], "description": text + ", or for a peer with an input schema the "
                "JSON object it takes."}
    return {"type": "string", "description": text + "."}


def send_definition(views) -> dict | None:
    """send_to_peer for a session whose peers are ``views`` (``services.peers.PeerView``); None without a send grant."""
    sendable = [v for v in views if v.allows("send")]
    if not sendable:
        return None
    return {
        "name": SEND_TOOL,
        "description": f"{SEND_DESCRIPTION}\n\nYour peers:\n{_peer_lines(sendable)}",
        "input_schema": {
            "type": "object",
            "properties": {
                "peer": {"type": "string", "enum": [v.name for v in sendable], "description": "The peer's name."},
                "body": _body_schema(sendable),
                "mode": {"type": "string", "enum": list(MODES), "default": "steer"},
                "in_reply_to": {"type": "string", "description": "A message id, for correlation only."},
            },
            "required": ["peer", "body"],
            "additionalProperties": False,
        },
    }


def reply_definition(views) -> dict | None:
    """reply_to_peer over any route back (a reply is authorized by the message it answers, not by a send grant)."""
    sendable = list(views)
    if not sendable:
        return None
    return {
        "name": REPLY_TOOL,
        "description": f"{REPLY_DESCRIPTION}\n\nPeers you can reply to:\n{_peer_lines(sendable)}",
        "input_schema": {
            "type": "object",
            "properties": {
                "peer": {"type": "string", "enum": [v.name for v in sendable],
                         "description": "Your route to the message's sender."},
                "message_id": {"type": "string", "description": "The id of the message you are answering."},
                "body": _body_schema(sendable),
                "mode": {"type": "string", "enum": list(MODES), "default": "steer"},
            },
            "required": ["peer", "message_id", "body"],
            "additionalProperties": False,
        },
    }


def inbox_definition(receives: bool) -> dict | None:
    """peer_inbox for a session that can receive peer mail (some source holds a send grant to it, or did send)."""
    if not receives:
        return None
    return {
        "name": INBOX_TOOL,
        "description": INBOX_DESCRIPTION,
        "input_schema": {
            "type": "object",
            "properties": {"limit": {"type": "integer", "minimum": 1, "maximum": INBOX_LIMIT, "default": 10},
                           "cursor": {"type": "string", "description": "The `next_cursor` of the previous page."}},
            "additionalProperties": False,
        },
    }


# ---- strict arguments --------------------------------------------------------------------------------


def _invalid(message: str) -> Rejected:
    return Rejected(Code.PEER_INVALID_ARGUMENTS, message)


def _object(raw: Any, allowed: list[str]) -> Mapping:
    raw = arguments.json_object(raw, _invalid, ", ".join(allowed))
    arguments.refuse_unknown(raw, allowed, _invalid, ". The destination, principal and return address come from "
                             "your host's peer routes, never from arguments")
    return raw


def _text(raw: Mapping, name: str, required: bool = True) -> str | None:
    if name not in raw:
        if required:
            raise _invalid(f"missing required argument `{name}`")
        return None
    value = raw[name]
    if not isinstance(value, str):
        raise _invalid(f"`{name}` must be a string")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise _invalid(f"`{name}` is not valid Unicode text (it contains a lone surrogate)") from None
    return value


def _body(raw: Mapping) -> str:
    if isinstance(raw.get("body"), (dict, list)):
        # An input for a peer with a schema: kept as compact JSON text, checked against the schema when decided.
        try:
            return json.dumps(raw["body"], separators=(",", ":"), ensure_ascii=False, allow_nan=False)
        except (ValueError, RecursionError):
            raise _invalid("`body` is not valid JSON") from None
    return _text(raw, "body")


def _common(raw: Mapping) -> tuple[str, str, str]:
    peer = (_text(raw, "peer") or "").strip()
    if not peer or len(peer) > 64:
        raise _invalid("`peer` must be one of your peers' names (at most 64 characters)")
    mode = raw.get("mode", "steer")
    if mode not in MODES:
        raise _invalid('`mode` must be "steer" or "queue"')
    return peer, _body(raw), mode


def _reference(raw: Mapping, name: str, required: bool) -> str | None:
    value = _text(raw, name, required)
    if value is None:
        return None
    value = value.strip()
    if not value or len(value) > MAX_REFERENCE_CHARS:
        raise _invalid(f"`{name}` must be a message id (1 to {MAX_REFERENCE_CHARS} characters)")
    return value


def parse_send(raw: Any) -> PeerSendArguments:
    raw = _object(raw, ["peer", "body", "mode", "in_reply_to"])
    peer, body, mode = _common(raw)
    return PeerSendArguments(peer=peer, body=body, mode=mode, in_reply_to=_reference(raw, "in_reply_to", False))


def parse_reply(raw: Any) -> PeerSendArguments:
    raw = _object(raw, ["peer", "message_id", "body", "mode"])
    peer, body, mode = _common(raw)
    return PeerSendArguments(peer=peer, body=body, mode=mode, in_reply_to=_reference(raw, "message_id", True),
                             reply=True)


def parse_inbox(raw: Any) -> tuple[int, str | None]:
    """(limit, cursor): the page size and where the previous page ended (None: the newest first)."""
    raw = _object(raw if raw not in (None, "") else {}, ["limit", "cursor"])
    limit = raw.get("limit", 10)
    if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= INBOX_LIMIT:
        raise _invalid(f"`limit` must be an integer from 1 to {INBOX_LIMIT}")
    return limit, _reference(raw, "cursor", False)


def inbox_row(entry: InboxEntry, readable: Collection[str], back: Mapping[str, str]) -> dict:
    """One entry of a page: with its provenance when the reader holds ``read`` on its sender, else its id and
    arrival with the refusal's code, so a reader is told what it may not see rather than miss it silently."""
    at = datetime.fromtimestamp(entry.at, timezone.utc).isoformat(timespec="seconds")
    if entry.sender_session_id not in readable:
        return {"message_id": entry.message_id, "at": at,
                "error": {"code": Code.PEER_NOT_GRANTED.value, "message": WITHHELD}}
    return {"message_id": entry.message_id, "sender": entry.sender_handle, "sender_session_id": entry.sender_session_id,
            "principal": entry.principal, "at": at, "in_reply_to": entry.in_reply_to,
            "reply_peer": back.get(entry.sender_session_id)}


# A page's cursor names an arrival number, never a message id: an entry read and let go still leaves the
# cursor that named it meaningful.
CURSOR_PREFIX = "before-"


def cursor_of(position: int | None) -> str | None:
    return None if position is None else f"{CURSOR_PREFIX}{position}"


def cursor_position(cursor: str | None) -> int | None:
    """The arrival number a cursor names; None for no cursor or for a text no page handed out."""
    if cursor is None or not cursor.startswith(CURSOR_PREFIX):
        return None
    digits = cursor[len(CURSOR_PREFIX):]
    return int(digits) if digits.isascii() and digits.isdigit() and len(digits) <= 12 and int(digits) > 0 else None
