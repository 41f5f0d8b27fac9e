"""Stable error codes of the send_message contract, and the error root every refusal sits under.

A model reacts to the code, so codes never change once shipped; messages may
become more helpful. Every error treemail raises for a caller's mistake or a
refusal is a ``TreemailError`` with a stable ``code``: a caller catches the
library's errors in one clause and branches on the code, not on the text.
The classes that were builtin errors before the root existed stay so too
(``UnknownSessionError`` is a ``LookupError``, ``IdentifierError`` a
``ValueError``), so an ``except`` written for them still catches them.
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
    # Direct-neighbour routing, content blocks, interrupt_agent
    NOT_DIRECT_NEIGHBOUR = "send_message:not_direct_neighbour"
    NOT_RESIDENT_CHILD = "send_message:not_resident_child"
    MODEL_DOES_NOT_SUPPORT_IMAGES = "send_message:model_does_not_support_images"
    INTERRUPT_INVALID_ARGUMENTS = "interrupt_agent:invalid_arguments"
    INTERRUPT_UNKNOWN_SESSION = "interrupt_agent:unknown_session"
    INTERRUPT_SELF = "interrupt_agent:self_interrupt"
    INTERRUPT_NOT_DIRECT_NEIGHBOUR = "interrupt_agent:not_direct_neighbour"
    INTERRUPT_NOT_RESIDENT_CHILD = "interrupt_agent:not_resident_child"
    INTERRUPT_PERMISSION_DENIED = "interrupt_agent:permission_denied"
    INTERRUPT_IDEMPOTENCY_CONFLICT = "interrupt_agent:idempotency_conflict"
    INTERRUPT_ENGINE_SHUTDOWN = "interrupt_agent:engine_shutdown"
    # the tool registry: a tool the calling session does not have installed (host tm.tools.call)
    UNKNOWN_TOOL = "unknown_tool"
    # Order and priority: the read receipt tool's arguments, and a recipient it cannot name.
    RECEIPT_INVALID_ARGUMENTS = "read_receipt:invalid_arguments"
    RECEIPT_UNKNOWN_RECIPIENT = "read_receipt:unknown_recipient"
    # Threads: `in_reply_to` names no message the sender received.
    UNKNOWN_REPLY = "send_message:unknown_reply"
    # Plugins observe and gate: a pre-send hook the host registered refused the send.
    PLUGIN_REFUSED = "send_message:plugin_refused"
    # Delivery as an obligation.
    SOURCE_CAPACITY = "send_message:source_capacity"
    UNKNOWN_MESSAGE = "message:unknown"
    NOT_PARKED = "retry_message:not_parked"
    SETTLED = "retry_message:settled"
    # Peer routes, grants, reply and inbox
    PEER_INVALID_ARGUMENTS = "peer_message:invalid_arguments"
    PEER_UNKNOWN = "peer_message:unknown_peer"
    PEER_NOT_GRANTED = "peer_message:not_granted"
    PEER_INPUT_MISMATCH = "peer_message:input_mismatch"
    PEER_UNKNOWN_REFERENCE = "peer_message:unknown_reference"
    PEER_FOREIGN_REFERENCE = "peer_message:reference_not_from_peer"
    PEER_IDEMPOTENCY_CONFLICT = "peer_message:idempotency_conflict"
    PEER_ENGINE_SHUTDOWN = "peer_message:engine_shutdown"
    # Peer mail as an outbox: the source's delivery rows are bounded (pending ones, accepted ones awaiting
    # their settlement, each on its own), and a delivery retried or inspected must be one the caller may see.
    PEER_OUTBOX_FULL = "peer_message:outbox_full"
    # The destination's peer inbox holds as many unread entries as it keeps: it admits more once some are read.
    PEER_INBOX_FULL = "peer_message:inbox_full"
    # Under attack and under faults: a send waiting on a person has its own deadline.
    APPROVAL_TIMEOUT = "send_message:approval_timeout"
    # Who may send, and sends that race the end of a session.
    SENDER_NOT_LIVE = "send_message:sender_not_live"
    DRAINING = "send_message:draining"
    RECIPIENT_CLOSING = "send_message:recipient_closing"
    SENDER_CLOSING = "send_message:sender_closing"
    PARENT_UNAVAILABLE = "send_message:parent_unavailable"
    NOT_RESUMABLE = "send_message:not_resumable"
    INTERRUPT_SENDER_NOT_LIVE = "interrupt_agent:sender_not_live"
    # The replicated profile: the append was made but its replicas did not confirm it in time.
    NOT_REPLICATED = "send_message:not_replicated"
    # Whole subtrees: the message_subtree tool (each copy's own refusal keeps its send_message code).
    SUBTREE_INVALID_ARGUMENTS = "message_subtree:invalid_arguments"
    SUBTREE_INVALID_BODY = "message_subtree:invalid_body"
    SUBTREE_UNKNOWN_SESSION = "message_subtree:unknown_session"
    SUBTREE_SENDER_NOT_LIVE = "message_subtree:sender_not_live"
    SUBTREE_IDEMPOTENCY_CONFLICT = "message_subtree:idempotency_conflict"
    SUBTREE_ENGINE_SHUTDOWN = "message_subtree:engine_shutdown"
    # Loop detection: a ping-pong with no new content (``loops.py``).
    LOOP_DETECTED = "send_message:loop_detected"
    # Cancel: peer mail whose admission attempt is in flight cannot be decided yet.
    CANCEL_IN_FLIGHT = "cancel_message:in_flight"


MAX_MESSAGE_CHARS = 8192


class TreemailError(Exception):
    """The root of every error treemail raises for a caller's mistake or a refusal. ``code``: stable, never
    empty on what is raised (a class either names its one code or takes one per raise)."""

    code: str = ""


class CodedError(TreemailError):
    """An error whose stable code is chosen where it is raised: ``str(error)`` is ``"<code>: <message>"``."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message

    # KeyError (a ``NotFound``) would show the text quoted, as a key; the message is a sentence.
    __str__ = Exception.__str__


class Rejected(TreemailError):
    """A decision that refuses a command. Carries its stable code and a message for the model."""

    def __init__(self, code: Code, message: str) -> None:
        # A model reads this: it is bounded whatever the model sent (a 1 MB `to` is not echoed back).
        message = message if len(message) <= MAX_MESSAGE_CHARS else message[:MAX_MESSAGE_CHARS - 1] + "…"
        super().__init__(f"{code.value}: {message}")
        self.code = code
        self.message = message


class LifecycleError(CodedError):
    """An illegal lifecycle transition requested by the host (not by a model): nothing changed."""


class InvalidRequest(CodedError, ValueError):
    """A host call whose values can never succeed as given (a peer route to a delegated child, an approval
    already decided): nothing changed. A ``ValueError`` too, as these calls raised before they had codes."""


class NotFound(CodedError, KeyError):
    """A host call named something that does not exist (an approval request, a message for the CLI to show).
    A ``KeyError`` (so a ``LookupError``) too, as these calls raised before they had codes."""


class ConfigError(TreemailError):
    """The configuration cannot be used; the message names the key and the fix. Not a ValueError: the
    settings parser would take one raised while it reads a source for a bad value and reword it."""

    code = "config:invalid"


class UnknownSessionError(TreemailError, LookupError):
    """A host API call named a session that was never registered."""

    code = "lifecycle:unknown_session"


class RedisUnavailable(TreemailError):
    """The Redis/Valkey server could not be reached after bounded retries."""

    code = "server:unavailable"
