"""Commands: what a caller asks of one session, in the imperative. Plain data, no behaviour.

Every command names the session whose stream it is decided on
(``session_id``); ``handlers.HANDLERS`` routes each type to its decide function.
"""

from dataclasses import dataclass
from typing import Literal

Status = Literal["queued", "running", "idle", "finished"]
STATUSES = ("queued", "running", "idle", "finished")


@dataclass(frozen=True)
class SendContext:
    """Who is sending: always from the host's execution context, never from model arguments."""

    session_id: str
    run_id: str
    tool_call_id: str


@dataclass(frozen=True)
class SendArguments:
    """The model's arguments after strict validation."""

    to: str
    body: str
    mode: Literal["steer", "queue"] = "steer"


@dataclass(frozen=True)
class SendMessage:
    """Decided by the worker pool, on the recipient's stream (or the sender's, for an approval request)."""

    command_id: str
    context: SendContext
    arguments: SendArguments
    reply_to: str

    @property
    def session_id(self) -> str:
        return self.context.session_id


@dataclass(frozen=True)
class RegisterSession:
    session_id: str
    root_session_id: str
    parent_session_id: str | None
    agent_type: str
    description: str
    handle: str
    rules: list[tuple[str, str]]
    send_message_tool: bool
    status: Status
    continuable: bool = True


@dataclass(frozen=True)
class ChangeStatus:
    session_id: str
    status: Status


@dataclass(frozen=True)
class StartRun:
    session_id: str
    run_id: str


@dataclass(frozen=True)
class FinishRun:
    session_id: str
    run_id: str


@dataclass(frozen=True)
class ClaimMail:
    session_id: str
    run_id: str


@dataclass(frozen=True)
class ConsumeMail:
    session_id: str
    message_id: str


@dataclass(frozen=True)
class ReleaseMail:
    session_id: str
    message_id: str


@dataclass(frozen=True)
class DiscardMail:
    session_id: str
    message_id: str
    reason: str = ""


@dataclass(frozen=True)
class InjectMail:
    """Mail from the host's own producers (plugin, delegation notification, goal)."""

    session_id: str
    message_id: str
    owner: Literal["plugin", "delegation", "goal"]
    body: str
    mode: Literal["steer", "queue"] = "queue"


@dataclass(frozen=True)
class RequestWake:
    """Reconcile: ask again for a wake the session needs, in case its trigger was lost."""

    session_id: str


@dataclass(frozen=True)
class ResolveApproval:
    """A person's answer to an approval request on the sender's stream."""

    session_id: str
    request_id: str
    decision: Literal["approve_once", "approve_tree", "deny"]


# Seed 002, part 1: disposal, settlement notices, draining.
STOP_REASONS = ("completed", "aborted", "max_tokens", "refusal", "error")


@dataclass(frozen=True)
class DisposeSession:
    """Open the send-versus-dispose cutoff (closing); ``CloseSession`` completes the disposal."""

    session_id: str
    stop_reason: str | None = None
    closing_text: str | None = None


@dataclass(frozen=True)
class CloseSession:
    """Set aside every message still pending, each with what became of it, and close the session.

    ``returned``: (message id, discard reason) for every pending agent message,
    after its sender was given a notice (or found gone).
    """

    session_id: str
    returned: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True)
class ReturnMail:
    """Decided on the original sender's stream: a notice that its message was not delivered, and why."""

    session_id: str
    message_id: str
    notice_id: str
    recipient_handle: str
    body: str
    stop_reason: str | None = None


@dataclass(frozen=True)
class SettleSession:
    """A child's run ended for good (``run_id``) or it was disposed: notify its parent, gated as the seed says."""

    session_id: str
    run_id: str | None
    stop_reason: str
    closing_text: str | None
    disposed: bool
    notice_id: str


@dataclass(frozen=True)
class DrainSession:
    """``by``: the session whose subtree is draining (this one, or an ancestor)."""

    session_id: str
    by: str


@dataclass(frozen=True)
class LiftDrain:
    session_id: str
    by: str


SessionCommand = (
    RegisterSession | ChangeStatus | StartRun | FinishRun | ClaimMail | ConsumeMail | ReleaseMail | DiscardMail
    | InjectMail | RequestWake | ResolveApproval
    | DisposeSession | CloseSession | ReturnMail | SettleSession | DrainSession | LiftDrain
)
