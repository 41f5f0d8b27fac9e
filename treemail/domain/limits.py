"""Byte limits on what callers name things with. Pure.

Every identifier a caller supplies that ends up in a stream (a run id, a
tool call id, an idempotency key, a handle's agent type, a peer name, a
stop reason) has a stated limit in UTF-8 bytes, checked at every entry point
(the host API, the tools' arguments, the MCP server, the CLI) before anything
is stored: a message's body is bounded by ``max_body_bytes``, and without
these an identifier riding beside it was not (a 4 MB tool call id was kept
in the recipient's stream for good). A refusal carries one stable code.
"""

import re
from collections.abc import Mapping
from dataclasses import fields
from functools import cache

from .errors import InvalidRequest

# Run ids, tool call ids, idempotency keys, message and request ids a caller names.
MAX_ID_BYTES = 256
# A host's own idempotency key for a programmatic send (``tm.send``): kept as its tool call id, "key:<key>".
MAX_IDEMPOTENCY_KEY_BYTES = 200
# Agent types (a handle is "<agent_type>_<8 hex>"), peer names and principals, stop reasons, owners.
MAX_NAME_BYTES = 64
# A session's description, shown to its tree's peers.
MAX_DESCRIPTION_BYTES = 4096
# A child's closing message block (its last words), carried into its parent's settlement notice.
MAX_CLOSING_TEXT_BYTES = 32768

TOO_LONG = "identifier:too_long"
INVALID = "identifier:invalid"


class IdentifierError(InvalidRequest):
    """An identifier a caller supplied is missing, not a string, or over its limit: nothing was stored."""


def shown(value, chars: int = 40) -> str:
    """A bounded prefix of a caller's value for an error message: a 4 MB argument is never echoed whole."""
    text = repr(value) if not isinstance(value, str) or len(value) <= chars else repr(value[:chars - 1]) + "…"
    return text if len(text) <= chars * 2 else text[:chars * 2 - 1] + "…"


# How deep the arrays and objects of a JSON body from a caller may nest (the gateway's; an MCP message's too):
# what treemail keeps nests a few levels, and a parser's recursion ends near a thousand.
MAX_JSON_DEPTH = 100
# A JSON string (escapes included), and what is not a bracket: what the depth count skips, in C.
_STRING = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"', re.S)
_NOT_BRACKET = re.compile(r"[^\[\]{}]+")


def nesting_depth(text: str) -> int:
    """How deep arrays and objects nest in ``text`` (brackets inside strings do not count); no recursion, and
    only the brackets are looked at one by one in Python (a 32 KB body: 7 ms char by char, under 1 ms so)."""
    depth = deepest = 0
    for ch in _NOT_BRACKET.sub("", _STRING.sub("", text)):
        if ch in "[{":
            depth += 1
            deepest = max(deepest, depth)
        else:
            depth -= 1
    return deepest


# A stream entry id as the server writes it: "<ms>-<seq>", each an unsigned 64-bit number.
_ENTRY_ID = re.compile(r"(\d{1,20})-(\d{1,20})", re.ASCII)


def is_entry_id(text) -> bool:
    """Whether ``text`` is a stream entry id the server could have written (one from a caller is checked
    before the server reads it: its refusal of a malformed one would come after the work, or as its error)."""
    found = _ENTRY_ID.fullmatch(text) if isinstance(text, str) else None
    return found is not None and all(int(part) < 2 ** 64 for part in found.groups())


def invalid(message: str) -> IdentifierError:
    return IdentifierError(INVALID, message)


def byte_length(value: str) -> int:
    return len(value.encode("utf-8", "surrogatepass"))


def text_size(name: str, value: str) -> int:
    """UTF-8 bytes of ``value``; ``IdentifierError`` for a lone surrogate, which no stream can store (it failed
    deep in the JSON encoder, after a registration's directory entry was written)."""
    try:
        return len(value.encode("utf-8"))
    except UnicodeEncodeError:
        raise IdentifierError(INVALID, f"{name} is not valid Unicode text (it contains a lone surrogate)") from None


def require_text(name: str, value, limit: int, *, optional: bool = False, empty: bool = False) -> str | None:
    """``value`` as given when it is a string (non-empty unless ``empty``) of at most ``limit`` UTF-8 bytes
    (or None, if ``optional``); otherwise ``IdentifierError``. The message never echoes the value (it may be
    4 MB)."""
    if value is None and optional:
        return None
    if not isinstance(value, str) or not (value or empty):
        raise IdentifierError(INVALID, f"{name} must be a non-empty string, got {type(value).__name__}")
    size = text_size(name, value)
    if size > limit:
        raise IdentifierError(TOO_LONG, f"{name} is {size} bytes; the limit is {limit} bytes")
    return value


def require_id(name: str, value, *, optional: bool = False) -> str | None:
    return require_text(name, value, MAX_ID_BYTES, optional=optional)


def require_name(name: str, value, *, optional: bool = False) -> str | None:
    return require_text(name, value, MAX_NAME_BYTES, optional=optional)


def require_ids(values: Mapping[str, object]) -> None:
    for name, value in values.items():
        require_id(name, value)


# A reason a host gives for discarding a message, or a model for an interrupt: kept with the event.
MAX_REASON_BYTES = 1024
# Message rules: each pattern, and how many a session's document may carry.
MAX_RULES = 64

# The limit of each command field a caller names, by field name; nested commands are checked field by field.
FIELD_LIMITS: dict[str, int] = {
    **dict.fromkeys(("session_id", "root_session_id", "parent_session_id", "source_session_id", "run_id",
                     "tool_call_id", "message_id", "notice_id", "request_id", "command_id", "reply_to",
                     "in_reply_to", "by", "handle", "recipient_handle", "child_handle", "source"), MAX_ID_BYTES),
    **dict.fromkeys(("agent_type", "name", "principal", "stop_reason", "peer", "owner"), MAX_NAME_BYTES),
    "description": MAX_DESCRIPTION_BYTES,
    "closing_text": MAX_CLOSING_TEXT_BYTES,
    "reason": MAX_REASON_BYTES,
    # A peer route's input schema (JSON), shown to the senders it admits.
    "input_schema": 16384,
}


# Fields that hold text whenever they are set: anything else (a number, a list) is refused by name.
TEXT_FIELDS = frozenset(FIELD_LIMITS) | {"body"}
RULE_FIELDS = ("rules", "interrupt_rules")


def check_command(command) -> None:
    """Every text field of ``command`` (and of the commands and contexts it carries) a string of valid
    Unicode, each identifier-like one within its limit, and its rules pairs of text within theirs;
    ``IdentifierError`` names the first that is not. Body sizes are the guards' (``max_body_bytes``)."""
    for name in _flags(type(command)):
        if not isinstance(getattr(command, name), bool):
            raise IdentifierError(INVALID, f"{name} must be true or false, got {type(getattr(command, name)).__name__}")
    for name in _required_text(type(command)):
        if getattr(command, name) is None:
            raise IdentifierError(INVALID, f"{name} must be a string, got NoneType")
    for name, value in vars(command).items():
        if isinstance(value, str):
            size = text_size(name, value)
            limit = FIELD_LIMITS.get(name)
            if limit is not None and size > limit:
                raise IdentifierError(TOO_LONG, f"{name} is {size} bytes; the limit is {limit} bytes")
        elif name in RULE_FIELDS:
            check_rules(name, value)
        elif hasattr(value, "__dataclass_fields__"):
            check_command(value)
        elif value is not None and name in TEXT_FIELDS and not (name == "body" and isinstance(value, (list, tuple))):
            # A body may be a list of content blocks (their own checks); every other text field is text.
            raise IdentifierError(INVALID, f"{name} must be a string, got {type(value).__name__}")


@cache
def _flags(cls: type) -> tuple[str, ...]:
    """The fields of a command class declared ``bool``: a 0 or a "yes" there would be read as a flag."""
    return tuple(f.name for f in fields(cls) if f.type in (bool, "bool"))


@cache
def _required_text(cls: type) -> tuple[str, ...]:
    """The text fields of a command class declared ``str`` alone: None there is no value, and the step would
    read it as one (a run id of None opened no run, a parent of None made a root)."""
    return tuple(f.name for f in fields(cls) if f.name in TEXT_FIELDS and f.type in (str, "str"))


def check_rules(name: str, rules) -> None:
    """Normalized rules: a list of (pattern, effect) pairs of text, at most ``MAX_RULES`` of them."""
    if not isinstance(rules, (list, tuple)):
        raise IdentifierError(INVALID, f"{name} must be a list of (pattern, effect) pairs")
    if len(rules) > MAX_RULES:
        raise IdentifierError(TOO_LONG, f"{name}: {len(rules)} rules; the limit is {MAX_RULES}")
    for rule in rules:
        if not (isinstance(rule, (list, tuple)) and len(rule) == 2 and all(isinstance(p, str) for p in rule)):
            raise IdentifierError(INVALID, f"{name}: each rule is a (pattern, effect) pair of strings")
        for part in rule:
            if text_size(name, part) > MAX_ID_BYTES:
                raise IdentifierError(TOO_LONG, f"{name}: a pattern is over {MAX_ID_BYTES} bytes")
