"""Byte limits on what callers name things with. Pure.

Every identifier a caller supplies that ends up in a stream (a run id, a
tool call id, an idempotency key, a handle's agent type, a peer name, a
stop reason) has a stated limit in UTF-8 bytes, checked at every entry point
(the host API, the tools' arguments, the MCP server, the CLI) before anything
is stored: a message's body is bounded by ``max_body_bytes``, and without
these an identifier riding beside it was not (a 4 MB tool call id was kept
in the recipient's stream for good). A refusal carries one stable code.
"""

from collections.abc import Mapping

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


class IdentifierError(ValueError):
    """An identifier a caller supplied is missing, not a string, or over its limit: nothing was stored."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message


def byte_length(value: str) -> int:
    return len(value.encode("utf-8", "surrogatepass"))


def require_text(name: str, value, limit: int, *, optional: bool = False) -> str | None:
    """``value`` as given when it is a non-empty string of at most ``limit`` UTF-8 bytes (or None, if
    ``optional``); otherwise ``IdentifierError``. The message never echoes the value (it may be 4 MB)."""
    if value is None and optional:
        return None
    if not isinstance(value, str) or not value:
        raise IdentifierError(INVALID, f"{name} must be a non-empty string, got {type(value).__name__}")
    size = byte_length(value)
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


def check_command(command) -> None:
    """Every identifier-like field of ``command`` (and of the commands and contexts it carries) within its
    limit, and its rules within theirs; ``IdentifierError`` names the first that is not. Bodies are the
    guards' (``max_body_bytes``), never checked here."""
    for name, value in vars(command).items():
        if isinstance(value, str):
            limit = FIELD_LIMITS.get(name)
            if limit is not None and byte_length(value) > limit:
                raise IdentifierError(TOO_LONG, f"{name} is {byte_length(value)} bytes; the limit is {limit} bytes")
        elif name in ("rules", "interrupt_rules") and isinstance(value, (list, tuple)):
            if len(value) > MAX_RULES:
                raise IdentifierError(TOO_LONG, f"{name}: {len(value)} rules; the limit is {MAX_RULES}")
            for rule in value:
                for part in rule:
                    if isinstance(part, str) and byte_length(part) > MAX_ID_BYTES:
                        raise IdentifierError(TOO_LONG, f"{name}: a pattern is over {MAX_ID_BYTES} bytes")
        elif hasattr(value, "__dataclass_fields__"):
            check_command(value)
