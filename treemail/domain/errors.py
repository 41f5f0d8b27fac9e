"""Stable error codes of the send_message contract, and the rejection that carries one.

A model reacts to the code, so codes never change once shipped; messages may
become more helpful.
"""

from enum import Enum


class Code(str, Enum):
    DISABLED = "send_message:disabled"
    INVALID_ARGUMENTS = "send_message:invalid_arguments"
    INVALID_BODY = "send_message:invalid_body"
    UNKNOWN_SESSION = "send_message:unknown_session"
    NOT_TREE_PEER = "send_message:not_tree_peer"
    SELF_SEND = "send_message:self_send"
    INBOX_FULL = "send_message:inbox_full"
    MAX_HOPS_EXCEEDED = "send_message:max_hops_exceeded"
    INFLIGHT_FULL = "send_message:inflight_full"
    ENGINE_SHUTDOWN = "send_message:engine_shutdown"
    IDEMPOTENCY_CONFLICT = "send_message:idempotency_conflict"
    PERMISSION_DENIED = "permission_denied"
    # Seed 002, part 1: who may send, and sends that race the end of a session.
    SENDER_NOT_LIVE = "send_message:sender_not_live"
    DRAINING = "send_message:draining"
    RECIPIENT_CLOSING = "send_message:recipient_closing"
    SENDER_CLOSING = "send_message:sender_closing"
    PARENT_UNAVAILABLE = "send_message:parent_unavailable"
    NOT_RESUMABLE = "send_message:not_resumable"


class Rejected(Exception):
    """A decision that refuses a command. Carries its stable code and a message for the model."""

    def __init__(self, code: Code, message: str) -> None:
        super().__init__(f"{code.value}: {message}")
        self.code = code
        self.message = message


class LifecycleError(Exception):
    """An illegal lifecycle transition requested by the host (not by a model): nothing changed."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message


class ConfigError(Exception):
    """The configuration cannot be used; the message names the key and the fix."""


class UnknownSessionError(LookupError):
    """A host API call named a session that was never registered."""


class RedisUnavailable(Exception):
    """The Redis/Valkey server could not be reached after bounded retries."""
