"""Events of a session stream: the storage contract, past tense, versioned with care.

Each event is stored as one stream entry with two fields, ``type`` and
``data`` (JSON). New fields are optional with defaults so an older stream still
reads; an unknown ``type`` is skipped by every fold.
"""

from typing import Literal

from pydantic import BaseModel, ConfigDict

Status = Literal["queued", "running", "idle", "finished"]
Mode = Literal["steer", "queue"]
# Who produced a message on the recipient: an agent via send_message, or one
# of the host's own producers that inject mail.
# "settlement" and "returned" are notices treemail itself writes (seed 002): never an agent's words.
OwnerKind = Literal["agent", "plugin", "delegation", "goal", "settlement", "returned"]


class Event(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)
    at: float = 0.0


class SessionRegistered(Event):
    session_id: str
    root_session_id: str
    parent_session_id: str | None
    agent_type: str
    description: str
    handle: str
    rules: list[tuple[str, str]]
    send_message_tool: bool
    status: Status
    # False: the host cannot start another run for it; treemail never wakes it (seed 002).
    continuable: bool = True


class SessionStatusChanged(Event):
    status: Status


class ProducerRegistered(Event):
    producer_id: str
    owner: OwnerKind
    sender_session_id: str | None = None


class ProducerMessageAccepted(Event):
    message_id: str
    producer_id: str
    owner: OwnerKind
    sender_session_id: str | None = None
    sender_handle: str | None = None
    body: str
    mode: Mode
    # Internal chain length; never rendered to a model.
    agent_hop: int = 0
    run_id: str | None = None
    tool_call_id: str | None = None


class SessionRunStarted(Event):
    run_id: str


class SessionRunFinished(Event):
    run_id: str


class SessionWakeRequested(Event):
    """The session is idle or finished and has mail due: a host runner must start a run."""

    message_id: str | None = None


class MessageEvent(Event):
    """A lifecycle step of one message; denormalized so every fold needs only the event."""

    message_id: str
    owner: OwnerKind
    sender_session_id: str | None = None
    agent_hop: int = 0
    run_id: str | None = None


class ProducerMessageAdmitted(MessageEvent):
    pass


class ProducerMessageClaimed(MessageEvent):
    pass


class ProducerMessageReleased(MessageEvent):
    pass


class ProducerMessageConsumed(MessageEvent):
    pass


class ProducerMessageDiscarded(MessageEvent):
    reason: str = ""


# Approvals live on the sending session's stream: an ``ask`` rule turned a send
# into a request a person decides. ``key`` is the send's idempotency digest and
# ``fingerprint`` binds the request to exactly what the person was shown.
class ApprovalRequested(Event):
    request_id: str
    key: str
    fingerprint: str
    sender_session_id: str
    sender_handle: str
    recipient_session_id: str
    recipient_handle: str
    label: str
    body: str
    mode: Mode


class ApprovalGranted(Event):
    request_id: str
    key: str
    # "once": this send only; "tree": every later ``ask`` send of this label in the tree.
    scope: Literal["once", "tree"]
    label: str


class ApprovalDenied(Event):
    request_id: str
    key: str


# Seed 002, part 1: disposal, settlement notices, draining.
class SessionClosing(Event):
    """The send-versus-dispose cutoff: from here on sends to and from the session are refused."""

    stop_reason: str | None = None
    closing_text: str | None = None


class SessionClosed(Event):
    """Disposal is complete: every message still pending was returned to its sender or set aside with its reason."""


class SessionSettled(Event):
    """The session's run ended for good, or it was disposed; and what treemail told its parent about it."""

    run_id: str | None = None
    stop_reason: str
    closing_text: str | None = None
    disposed: bool = False
    # not_announced, parent_unavailable, injected, queued or steered (the seed's gates, in order).
    notice: str
    message_id: str | None = None


class SessionDrainStarted(Event):
    """New sends from or to this session are refused; ``by`` is the session whose subtree is draining."""

    by: str


class SessionDrainLifted(Event):
    by: str


EVENT_TYPES: dict[str, type[Event]] = {
    cls.__name__: cls
    for cls in (
        SessionRegistered,
        SessionStatusChanged,
        ProducerRegistered,
        ProducerMessageAccepted,
        SessionRunStarted,
        SessionRunFinished,
        SessionWakeRequested,
        ProducerMessageAdmitted,
        ProducerMessageClaimed,
        ProducerMessageReleased,
        ProducerMessageConsumed,
        ProducerMessageDiscarded,
        ApprovalRequested,
        ApprovalGranted,
        ApprovalDenied,
        # Seed 002, part 1.
        SessionClosing,
        SessionClosed,
        SessionSettled,
        SessionDrainStarted,
        SessionDrainLifted,
    )
}


def encode(event: Event) -> tuple[str, str]:
    return type(event).__name__, event.model_dump_json()


def decode(type_name: str, data: str | bytes) -> Event | None:
    """The event, or None for a type this version does not know (a newer writer's)."""
    cls = EVENT_TYPES.get(type_name)
    return cls.model_validate_json(data) if cls else None
