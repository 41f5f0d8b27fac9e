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
