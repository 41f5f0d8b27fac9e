"""Commands: what a caller asks of one session, in the imperative. Plain data, no behaviour.

Every command names the session whose stream it is decided on
(``session_id``); ``handlers.HANDLERS`` routes each type to its decide function.

Over the house's 200 lines: every command, each a few lines of plain data, in one file beside the
command table that routes them.
"""

from dataclasses import dataclass, field
from typing import Literal, get_args

from . import limits

Status = Literal["queued", "running", "idle", "finished"]
STATUSES = ("queued", "running", "idle", "finished")
# policy_rejected: a delivery a pre-step policy of the host rejected; its parent reads it as declined.
StopReason = Literal["completed", "aborted", "max_tokens", "refusal", "policy_rejected", "error"]


@dataclass(frozen=True)
class SendContext:
    """Who is sending: always from the host's execution context, never from model arguments."""

    session_id: str
    run_id: str
    tool_call_id: str

    def __post_init__(self) -> None:
        # Each is kept in the recipient's stream with the message (``limits``): checked before anything is.
        limits.require_id("session_id", self.session_id)
        if self.run_id != "":  # a host send from a session with no open run: refused as sender_not_live
            limits.require_id("run_id", self.run_id)
        limits.require_id("tool_call_id", self.tool_call_id)


@dataclass(frozen=True)
class SendArguments:
    """The model's arguments after strict validation."""

    to: str
    body: str
    mode: Literal["steer", "queue"] = "steer"
    # Content blocks: the message's content blocks (``blocks.Block``), when it is more than text.
    blocks: tuple | None = None
    # Threads: the message this one answers (the model's, checked by the host to be one the sender
    # received) and that message's thread, which the answer joins (the host's, never the model's).
    in_reply_to: str | None = None
    thread_id: str | None = None
    # Expiry and supersede: the host's send options, never a model's (``mailcontrol.py``). Seconds from the
    # decision until the message expires unclaimed (None: never), and the key a newer message replaces it by.
    expires_in_s: float | None = None
    supersede_key: str | None = None
    # Order and priority: sent urgent (the host's option, or the model's argument where the host enabled it).
    urgent: bool = False
    # Order and priority: the host asked for the message's number in its pair in the result (its own richer
    # send); the plain tool result is the three contract keys unless the sender has the read receipt tool.
    numbered: bool = False


@dataclass(frozen=True)
class SendMessage:
    """Decided by the worker pool, on the recipient's stream (or the sender's, for an approval request)."""

    command_id: str
    context: SendContext
    arguments: SendArguments
    reply_to: str
    # W3C trace context of the preparation span ("" when tracing is off).
    traceparent: str = ""

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
    # None: registered without a handle (a pre-handle session), addressed by UUID only.
    handle: str | None
    rules: list[tuple[str, str]]
    send_message_tool: bool
    status: Status
    # Direct routing, content blocks, interrupt_agent
    resident: bool = True
    continuable: bool = True
    accepts_images: bool = False
    interrupt_rules: list[tuple[str, str]] = field(default_factory=list)
    # The host gives the child its task directly (not as treemail mail): announced in the same step.
    announced: bool = False


@dataclass(frozen=True)
class ChangeStatus:
    session_id: str
    status: Status


@dataclass(frozen=True)
class StartRun:
    session_id: str
    run_id: str
    # The run carries the task the host gave the child directly (its first run): announced in the same step.
    announced: bool = False


@dataclass(frozen=True)
class AnnounceSession:
    """The host says it gave the session its task directly: it owes its parent a settlement notice."""

    session_id: str


@dataclass(frozen=True)
class Settle:
    """The settlement a finish or a disposal earns, decided in the same atomic step: the child's
    ``SessionSettled`` and its parent's notice (parent and child share a partition).

    ``stop_reason``: whatever the host reported (a known one is worded for it, any other generically).
    ``notice_id``: the notice's message id, chosen before the decision so that a retried step writes
    the same one. ``parent_session_id`` and ``child_handle`` come from the child's record."""

    stop_reason: str
    closing_text: str | None
    notice_id: str
    parent_session_id: str | None
    child_handle: str | None
    # The parent's state could not be read (a corrupt snapshot): the child's end stands, nobody is told.
    parent_unreadable: bool = False


@dataclass(frozen=True)
class FinishRun:
    session_id: str
    run_id: str
    reason: str = "completed"
    # Given: the run's turn is over and the parent is told (once, however often the finish is repeated).
    settle: Settle | None = None
    # The host restarted and this run did not survive it (``reconcile``): its mail is due again at once.
    interrupted: bool = False


@dataclass(frozen=True)
class RenewRun:
    """The agent of a leased run (over streamable HTTP) made a call: the run is alive (``SessionRunRenewed``)."""

    session_id: str
    run_id: str


@dataclass(frozen=True)
class ClaimMail:
    session_id: str
    run_id: str
    # The engine's step boundary (its model request) the claim is made at; None: not reported.
    step: int | None = None


@dataclass(frozen=True)
class ClaimTurn:
    """A turn boundary of an agent that runs as long as its connection (an MCP-only agent): everything
    pending is due, queued mail included, since each of its mail checks starts a new turn of its model."""
    session_id: str
    run_id: str


@dataclass(frozen=True)
class ConsumeMail:
    session_id: str
    message_id: str
    # The step whose model request carried the message, and the tokens it took in the recipient's context.
    step: int | None = None
    tokens: int | None = None
    # The consume's span context ("" when tracing is off); recorded, else the message's own is.
    traceparent: str = ""


@dataclass(frozen=True)
class ReleaseMail:
    session_id: str
    message_id: str
    # Why the host's attempt failed, in its words ("rate_limited", "model error 529"): one printable line
    # of at most ``MAX_RELEASE_DETAIL`` characters; recorded on the release, shown by ``inspect``.
    reason: str = ""


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


# interrupt_agent
@dataclass(frozen=True)
class InterruptArguments:
    """The model's interrupt_agent arguments after strict validation."""

    to: str
    reason: str = ""


@dataclass(frozen=True)
class InterruptAgent:
    """Decided in the host process (``services.interrupts``) on the target's stream, like a send."""

    context: SendContext
    arguments: InterruptArguments

    @property
    def session_id(self) -> str:
        return self.context.session_id


# Revert and fork.
@dataclass(frozen=True)
class RevertSession:
    """The engine took the session's history back to ``to_position`` (a position of its stream)."""

    session_id: str
    to_position: int


@dataclass(frozen=True)
class ForkSession:
    """Register ``registration`` (a new session) as a fork of ``source_session_id`` at ``at_position``."""

    registration: RegisterSession
    source_session_id: str
    at_position: int

    @property
    def session_id(self) -> str:
        return self.registration.session_id


# effective permissions: the host's session overlay of message rules
@dataclass(frozen=True)
class OverlayMessageRules:
    """Lay ``rules`` over the agent document's for this session; an empty list removes the overlay."""

    session_id: str
    rules: list[tuple[str, str]]


# Delivery as an obligation.
@dataclass(frozen=True)
class KeepObligations:
    """The pump (or reconcile): act on whatever this session's mail is owed at ``now``.

    Expired claims are released (or parked), passed deadlines park, and an
    asleep session with mail due gets a wake if none is outstanding, or if
    the outstanding one was requested before ``stale_before`` or more than an
    attempt timeout ago (its trigger may be lost).
    """

    session_id: str
    stale_before: float = 0.0


@dataclass(frozen=True)
class RetryMail:
    """Renew a parked message's retry budget (authorized as control over its sender, by the host)."""

    session_id: str
    message_id: str
# Peer routes between independent agents
@dataclass(frozen=True)
class PeerSendArguments:
    """The model's send_to_peer / reply_to_peer arguments after strict validation: a peer name, never an address."""

    peer: str
    # The message text; over a route with an input schema, the JSON text of an input matching it.
    body: str
    mode: Literal["steer", "queue"] = "steer"
    # A plain send: correlation only, it grants nothing. A reply: one of the caller's actual inbound references.
    in_reply_to: str | None = None
    reply: bool = False
    # Peer mail is text (or JSON text); the send path reads ``blocks`` of every argument type.
    blocks: None = None


@dataclass(frozen=True)
class SendToPeer:
    """Decided in the host process (``services.peers``): stored on the sender's stream as an intent."""

    context: SendContext
    arguments: PeerSendArguments
    # W3C trace context of the send's preparation: every admission attempt is a span of the same trace.
    traceparent: str = ""

    @property
    def session_id(self) -> str:
        return self.context.session_id


@dataclass(frozen=True)
class RegisterPeerRoute:
    """On the target's stream: sessions of ``source`` may address it as ``name``."""

    session_id: str
    source_kind: Literal["session", "agent_type"]
    source: str
    name: str
    description: str = ""
    # JSON text of the receiving agent's input schema ("" for none): frozen commands hold no dicts.
    input_schema: str = ""


@dataclass(frozen=True)
class RevokePeerRoute:
    session_id: str
    source_kind: Literal["session", "agent_type"]
    source: str
    name: str


@dataclass(frozen=True)
class SetPeerGrant:
    """On the target's stream: what ``source`` may do to it; every operation not named is denied."""

    session_id: str
    source_kind: Literal["session", "agent_type"]
    source: str
    principal: str
    context: bool = False
    read: bool = False
    send: bool = False
    control: bool = False


# Disposal, settlement notices, draining. One list of stop reasons (FinishRun's too).
STOP_REASONS: tuple[str, ...] = get_args(StopReason)


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
    # Given (the disposal had a stop reason): the parent's settlement notice, written with the close.
    settle: Settle | None = None


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
    """A child's run ended for good (``run_id``) or it was disposed: notify its parent, through the notice's gates."""

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




# Peer mail as an outbox: what a driver (the pump, or the host's first attempt) decides on the source.
@dataclass(frozen=True)
class DrivePeerDelivery:
    """Advance one delivery as the policy says at ``now``: start the next admission attempt, fail an attempt
    that timed out, or park it (attempts spent, deadline passed). ``attempt``: the attempt a driver means to
    start; another driver that started it first leaves nothing to do."""

    session_id: str
    message_id: str


@dataclass(frozen=True)
class RecordPeerAdmission:
    """The destination's answer to admission attempt ``attempt``: ``accepted`` (with its receipt),
    ``refused`` (definite, ``code``) or ``failed`` (may pass later, ``code``)."""

    session_id: str
    message_id: str
    attempt: int
    outcome: Literal["accepted", "refused", "failed"]
    code: str = ""
    position: int = 0
    recipient_state: str = ""
    # Order and priority: the number the destination gave the message in its pair.
    sequence: int | None = None
    # A definite refusal: the id of the notice that tells the sender (none: it is not told).
    notice_id: str = ""


@dataclass(frozen=True)
class SettlePeerDelivery:
    """The destination consumed or discarded the message: the delivery is processed, its capacity released."""

    session_id: str
    message_id: str
    outcome: Literal["consumed", "discarded"]
    reason: str = ""


@dataclass(frozen=True)
class DiscardPeerDelivery:
    """The host gives up on a parked delivery: it is processed (discarded, with ``reason``), its capacity freed."""

    session_id: str
    message_id: str
    reason: str = ""


@dataclass(frozen=True)
class RetryPeerDelivery:
    """Renew a parked delivery's budget (after the ``control`` grant, or by the host)."""

    session_id: str
    message_id: str


# Tools installed one by one: the model-facing tools beyond send_message and interrupt_agent
# (which the rules govern) are offered to a session only once its host installs them.
# Installed like a tool, it adds no tool: it offers send_message's optional `urgent` argument.
URGENT_SEND = "urgent_send"
# Order and priority: the tool that reads how far a recipient has read; with it, a send result carries `sequence`.
READ_RECEIPT = "read_receipt"


INSTALLABLE_TOOLS = ("inspect_message", "retry_message", "send_to_peer", "reply_to_peer", "peer_inbox", "search_mail",
                     # Whole subtrees: a broadcast to every descendant.
                     "message_subtree",
                     # Cancel: take back one's own undelivered message.
                     "cancel_message",
                     # Order and priority: the read receipt tool, and send_message's `urgent` argument.
                     READ_RECEIPT, URGENT_SEND)


@dataclass(frozen=True)
class InstallTools:
    """Offer exactly these optional tools to the session's model from now on (an empty tuple: none)."""

    session_id: str
    tools: tuple[str, ...]


# Whole subtrees: a broadcast to every descendant and a cascading stop, bottom-up.
@dataclass(frozen=True)
class BroadcastToSubtree:
    """Record a broadcast from ``run_id`` of this session to ``recipients`` (its descendants, fixed now)."""

    session_id: str
    broadcast_id: str
    run_id: str
    body: str
    mode: str
    recipients: tuple[str, ...]
    tool_call_id: str | None = None


@dataclass(frozen=True)
class RecordBroadcastDelivery:
    """What became of each copy of a broadcast: recipient -> message id, recipient -> refusal code."""

    session_id: str
    broadcast_id: str
    accepted: tuple[tuple[str, str], ...] = ()
    refused: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True)
class SealSession:
    """A cascading stop reached this session: refuse new children under it, and close it for good when disposed."""

    session_id: str
    stop_id: str


@dataclass(frozen=True)
class StopSubtree:
    """Record a cascading stop of this session's subtree, in ``order`` (descendants before ancestors)."""

    session_id: str
    stop_id: str
    how: str
    order: tuple[str, ...]
    reason: str | None = None


@dataclass(frozen=True)
class InterruptRun:
    """The host interrupts this session's open run (a cascading stop): no tool call, no permission rule."""

    session_id: str
    interrupt_id: str
    by_session_id: str
    by_handle: str = ""
    reason: str = ""
# Cancel: decided on the recipient's stream, where a claim and a cancel are ordered by its etag.
@dataclass(frozen=True)
class CancelMail:
    session_id: str
    message_id: str
    # Who asked: "sender" (the sending session) or "host".
    by: str = "host"
    # What the sender's record said of the message when the cancel was asked: "" (not settled), "consumed",
    # or the reason it was discarded. The recipient's mail no longer holds a settled message, so the answer
    # recorded on its stream is told how it ended.
    settled: str = ""


# Cancel of peer mail still in its source's outbox: decided on the source, where every admission attempt
# is started, so an attempt and a cancel are ordered there.
@dataclass(frozen=True)
class CancelPeerDelivery:
    session_id: str
    message_id: str
    by: str = "host"
    # As ``CancelMail.settled``: how the delivery ended before the cancel ("": it had not).
    settled: str = ""


SessionCommand = (
    RegisterSession | ChangeStatus | StartRun | FinishRun | RenewRun | ClaimMail | ClaimTurn | ConsumeMail
    | ReleaseMail | DiscardMail | InjectMail | RequestWake | ResolveApproval | RevertSession | ForkSession
    | OverlayMessageRules | KeepObligations | RetryMail | RegisterPeerRoute | RevokePeerRoute | SetPeerGrant | InstallTools
    | DisposeSession | CloseSession | ReturnMail | SettleSession | DrainSession | LiftDrain
    | DrivePeerDelivery | RecordPeerAdmission | SettlePeerDelivery | RetryPeerDelivery | DiscardPeerDelivery
    # Whole subtrees.
    | BroadcastToSubtree | RecordBroadcastDelivery | StopSubtree | SealSession | InterruptRun
    | CancelMail | CancelPeerDelivery
    | AnnounceSession
)
