"""Decisions on a session stream: pure functions from (command, state) to events or a rejection.

No Redis, no asyncio. Every guard is one ``require_*`` function that raises
``Rejected`` with its stable code; the service layer loads state, calls these,
and appends the events atomically with an expected version.
"""

import hashlib
import json
from dataclasses import dataclass, field

from .. import permissions
from ..config import MessagingConfig
from ..errors import Code, LifecycleError, Rejected
from . import events as ev
from .commands import SendArguments, SendContext
from .state import MailItem, SessionState, fold


@dataclass(frozen=True)
class SessionRecord:
    """A session's origin, written once at registration; the directory entry."""

    session_id: str
    root_session_id: str
    parent_session_id: str | None
    agent_type: str
    description: str
    handle: str
    rules: list[tuple[str, str]]
    send_message_tool: bool
    partition: int

    @property
    def origin(self) -> permissions.Origin:
        return permissions.Origin(self.session_id, self.parent_session_id)

    def to_json(self) -> str:
        return json.dumps(self.__dict__, separators=(",", ":"))

    @classmethod
    def from_json(cls, text: str | bytes) -> "SessionRecord":
        data = json.loads(text)
        data["rules"] = [tuple(rule) for rule in data["rules"]]
        return cls(**data)


@dataclass(frozen=True)
class Peer:
    record: SessionRecord
    status: str


# What the loader found for the model's `to`.
@dataclass(frozen=True)
class Found:
    record: SessionRecord
    state: SessionState


@dataclass(frozen=True)
class NoSuchSession:
    session_id: str


@dataclass(frozen=True)
class NoSuchHandle:
    reference: str
    peers: list[Peer] = field(default_factory=list)


Target = Found | NoSuchSession | NoSuchHandle


# Outcomes of a send decision.
@dataclass(frozen=True)
class Accepted:
    events: list[ev.Event]
    result: dict


@dataclass(frozen=True)
class Refused:
    code: Code
    message: str
    # A refusal that depends on mutable recipient state is recorded under the
    # idempotency key, so a redelivered command gets the same answer.
    recorded: bool = False


@dataclass(frozen=True)
class Replayed:
    outcome: dict


@dataclass(frozen=True)
class NeedsApproval:
    label: str


Decision = Accepted | Refused | Replayed | NeedsApproval


def outcome_of(decision: Accepted | Refused | Replayed) -> dict:
    """What the producer is answered, and what the idempotency record keeps."""
    match decision:
        case Accepted(result=result):
            return {"ok": result}
        case Refused(code=code, message=message):
            return {"error": {"code": code.value, "message": message}}
        case Replayed(outcome=outcome):
            return outcome
    raise AssertionError(decision)


@dataclass(frozen=True)
class Approval:
    """What a person said about this exact send (by idempotency key) or this tree."""

    status: str | None = None  # None, "pending", "approved", "denied"
    tree_granted: bool = False


def idempotency_digest(context: SendContext) -> str:
    raw = json.dumps([context.session_id, context.run_id, context.tool_call_id])
    return hashlib.sha256(raw.encode()).hexdigest()[:32]


def fingerprint(arguments: SendArguments) -> str:
    raw = json.dumps([arguments.to, arguments.body, arguments.mode])
    return hashlib.sha256(raw.encode()).hexdigest()[:32]


def recipient_state_label(status: str) -> str:
    return {"running": "running", "queued": "queued"}.get(status, "waking_finished")


def replay(record: dict, arguments: SendArguments) -> Replayed | Refused:
    if record["fp"] != fingerprint(arguments):
        return Refused(
            Code.IDEMPOTENCY_CONFLICT,
            "this tool call was already sent with different arguments; make a new tool call to send another message",
        )
    return Replayed(record["outcome"])


def require_enabled(config: MessagingConfig) -> None:
    if not config.enabled:
        raise Rejected(Code.DISABLED, "agent messaging is disabled in this engine ([messaging] enabled = false)")


def require_tool(sender: SessionRecord) -> None:
    if not (sender.send_message_tool and permissions.tool_visible(sender.rules)):
        raise Rejected(Code.PERMISSION_DENIED, "permission denied: this agent has no send_message tool")


def require_body(body: str, limit: int, what: str = "send_message") -> None:
    size = len(body.encode("utf-8"))
    if size == 0:
        raise Rejected(Code.INVALID_BODY, "body is empty; write the message in `body`")
    if size > limit:
        raise Rejected(
            Code.INVALID_BODY,
            f"body is {size} bytes (UTF-8); the limit is {limit} bytes: shorten the message",
        )


def render_peer(peer: Peer) -> str:
    record = peer.record
    return f"{record.handle} — {record.description} — {peer.status} (session_id {record.session_id})"


def require_recipient(sender: SessionRecord, target: Target) -> Found:
    match target:
        case NoSuchSession(session_id=session_id):
            raise Rejected(Code.UNKNOWN_SESSION, f"no session has id {session_id}")
        case NoSuchHandle(reference=reference, peers=peers):
            listing = "\n".join(f"- {render_peer(p)}" for p in peers) or "- (no addressable peers)"
            raise Rejected(
                Code.UNKNOWN_SESSION,
                f"unknown subagent reference `{reference}`: use a handle or session_id from this list of "
                f"agents in your tree:\n{listing}",
            )
        case Found(record=record, state=state) if not state.registered:
            raise Rejected(Code.UNKNOWN_SESSION, f"no session has id {record.session_id}")
        case Found(record=record) if record.root_session_id != sender.root_session_id:
            raise Rejected(Code.NOT_TREE_PEER, f"session {record.session_id} is not in your delegation tree")
        case Found(record=record) if record.session_id == sender.session_id:
            raise Rejected(Code.SELF_SEND, "you cannot send a message to yourself")
        case Found():
            return target
    raise AssertionError(target)


def sending_hop(sender_state: SessionState, run_id: str) -> int:
    observed = sender_state.run_hops.get(run_id)
    return 0 if observed is None else observed + 1


def require_hops(hop: int, config: MessagingConfig) -> None:
    if config.max_hops > 0 and hop > config.max_hops:
        raise Rejected(
            Code.MAX_HOPS_EXCEEDED,
            f"this message would be hop {hop} of a chain limited to {config.max_hops} hops; "
            "stop relaying and report to your parent instead",
        )


def require_inbox_room(state: SessionState, config: MessagingConfig) -> None:
    if state.pending_agent >= config.max_pending_per_session:
        raise Rejected(
            Code.INBOX_FULL,
            f"the recipient already has {state.pending_agent} unread agent messages "
            f"(limit {config.max_pending_per_session}); try again later",
        )


def require_window_room(state: SessionState, sender_id: str, config: MessagingConfig) -> None:
    window = config.max_inflight_per_pair
    if window > 0 and state.pair_inflight.get(sender_id, 0) >= window:
        raise Rejected(
            Code.INFLIGHT_FULL,
            f"you already have {window} messages to this recipient that it has not processed; "
            "wait for it to read them before sending more",
        )


def agent_producer_id(sender_session_id: str) -> str:
    return f"agent:{sender_session_id}"


def decide_send(
    context: SendContext,
    arguments: SendArguments,
    sender: SessionRecord | None,
    sender_state: SessionState,
    target: Target,
    config: MessagingConfig,
    *,
    idempotency_record: dict | None = None,
    approval: Approval = Approval(),
    message_id: str,
    now: float = 0.0,
) -> Decision:
    if idempotency_record is not None:
        return replay(idempotency_record, arguments)
    try:
        if sender is None or not sender_state.registered:
            raise Rejected(Code.UNKNOWN_SESSION, "the sending session is not registered with treemail")
        require_enabled(config)
        require_tool(sender)
        require_body(arguments.body, config.max_body_bytes)
        found = require_recipient(sender, target)
        label = permissions.relationship(sender.origin, found.record.origin)
        effect = permissions.evaluate(sender.rules, label)
        if effect == "deny" or (effect == "ask" and approval.status == "denied" and not approval.tree_granted):
            raise Rejected(Code.PERMISSION_DENIED, f"permission denied: message to your {label_text(label)}")
        if effect == "ask" and approval.status != "approved" and not approval.tree_granted:
            return NeedsApproval(label)
        hop = sending_hop(sender_state, context.run_id)
        try:
            require_hops(hop, config)
            require_inbox_room(found.state, config)
            require_window_room(found.state, sender.session_id, config)
        except Rejected as guard:
            return Refused(guard.code, guard.message, recorded=True)
    except Rejected as rejection:
        return Refused(rejection.code, rejection.message)

    producer_id = agent_producer_id(sender.session_id)
    events: list[ev.Event] = []
    if producer_id not in found.state.producers:
        events.append(
            ev.ProducerRegistered(at=now, producer_id=producer_id, owner="agent", sender_session_id=sender.session_id)
        )
    events.append(
        ev.ProducerMessageAccepted(
            at=now,
            message_id=message_id,
            producer_id=producer_id,
            owner="agent",
            sender_session_id=sender.session_id,
            sender_handle=sender.handle,
            body=arguments.body,
            mode=arguments.mode,
            agent_hop=hop,
            run_id=context.run_id,
            tool_call_id=context.tool_call_id,
        )
    )
    result = {
        "message_id": message_id,
        "mode": arguments.mode,
        "recipient_state": recipient_state_label(found.state.status),
    }
    return Accepted(with_wake(found.state, events, now), result)


def with_wake(state: SessionState, events: list[ev.Event], now: float = 0.0) -> list[ev.Event]:
    """Add a wake request when these events leave an idle or finished session with mail due.

    At most one wake is outstanding per session: more mail before the woken
    run starts rides on the same wake.
    """
    after = fold(events, state)
    if after.status in ("idle", "finished") and after.current_run is None and after.pending_all > 0 \
            and not after.wake_pending:
        reason = next((e.message_id for e in reversed(events) if isinstance(e, ev.ProducerMessageAccepted)), None)
        return [*events, ev.SessionWakeRequested(at=now, message_id=reason)]
    return events


def label_text(label: str) -> str:
    return {"*": "tree peer"}.get(label, label)


def decide_inject(
    state: SessionState, owner: str, body: str, mode: str, config: MessagingConfig, *, message_id: str, now: float = 0.0
) -> list[ev.Event]:
    """Mail from the host's own producers: same lifecycle, own body cap, never counted by the agent guards."""
    if not state.registered:
        raise LifecycleError("lifecycle:unknown_session", "the session is not registered")
    require_body(body, config.max_injected_body_bytes)
    producer_id = f"{owner}:host"
    events: list[ev.Event] = []
    if producer_id not in state.producers:
        events.append(ev.ProducerRegistered(at=now, producer_id=producer_id, owner=owner))
    events.append(
        ev.ProducerMessageAccepted(
            at=now, message_id=message_id, producer_id=producer_id, owner=owner, body=body, mode=mode
        )
    )
    return with_wake(state, events, now)


# ---- lifecycle (host side) ----------------------------------------------------------------------

def require_registered(state: SessionState) -> None:
    if not state.registered:
        raise LifecycleError("lifecycle:unknown_session", "the session is not registered")


def require_mail(mail: dict[str, MailItem], message_id: str) -> MailItem:
    item = mail.get(message_id)
    if item is None:
        raise LifecycleError(
            "lifecycle:unknown_message", f"message {message_id} is not pending on this session"
        )
    return item


def require_claimed(item: MailItem) -> None:
    if item.state != "claimed":
        raise LifecycleError(
            "lifecycle:not_claimed", f"message {item.message_id} is {item.state}, not claimed"
        )


def _message_event(cls, item: MailItem, run_id: str | None, now: float, **extra) -> ev.MessageEvent:
    return cls(
        at=now,
        message_id=item.message_id,
        owner=item.owner,
        sender_session_id=item.sender_session_id,
        agent_hop=item.agent_hop,
        run_id=run_id,
        **extra,
    )


def decide_status(state: SessionState, status: str, now: float = 0.0) -> list[ev.Event]:
    require_registered(state)
    if state.status == status:
        return []
    return with_wake(state, [ev.SessionStatusChanged(at=now, status=status)], now)


def decide_start_run(state: SessionState, mail: dict[str, MailItem], run_id: str, now: float = 0.0) -> list[ev.Event]:
    """A run starts: every pending, unclaimed message is admitted into it as its input."""
    require_registered(state)
    if state.current_run == run_id:
        return []
    if state.current_run is not None:
        raise LifecycleError(
            "lifecycle:run_active", f"run {state.current_run} is still active; finish it before starting {run_id}"
        )
    events: list[ev.Event] = [ev.SessionRunStarted(at=now, run_id=run_id)]
    for item in sorted(mail.values(), key=lambda m: m.seq):
        if item.state != "claimed":
            events.append(_message_event(ev.ProducerMessageAdmitted, item, run_id, now))
    return events


def due_in_run(item: MailItem, run_id: str) -> bool:
    """Due at this boundary: admitted to this run, released, or steer mail joining the running turn."""
    if item.state == "admitted":
        return item.run_id == run_id
    if item.state == "released":
        return True
    return item.state == "accepted" and item.mode == "steer"


def decide_claim(state: SessionState, mail: dict[str, MailItem], run_id: str, now: float = 0.0) -> list[ev.Event]:
    require_registered(state)
    if state.current_run != run_id:
        raise LifecycleError("lifecycle:not_current_run", f"run {run_id} is not the session's current run")
    due = sorted((m for m in mail.values() if due_in_run(m, run_id)), key=lambda m: m.seq)
    return [_message_event(ev.ProducerMessageClaimed, item, run_id, now) for item in due]


def decide_consume(state: SessionState, mail: dict[str, MailItem], message_id: str, now: float = 0.0) -> list[ev.Event]:
    require_registered(state)
    item = require_mail(mail, message_id)
    require_claimed(item)
    return [_message_event(ev.ProducerMessageConsumed, item, item.run_id, now)]


def decide_release(state: SessionState, mail: dict[str, MailItem], message_id: str, now: float = 0.0) -> list[ev.Event]:
    require_registered(state)
    item = require_mail(mail, message_id)
    require_claimed(item)
    return [_message_event(ev.ProducerMessageReleased, item, item.run_id, now)]


def decide_discard(
    state: SessionState, mail: dict[str, MailItem], message_id: str, reason: str, now: float = 0.0
) -> list[ev.Event]:
    require_registered(state)
    item = require_mail(mail, message_id)
    return [_message_event(ev.ProducerMessageDiscarded, item, item.run_id, now, reason=reason)]


def decide_finish_run(
    state: SessionState, mail: dict[str, MailItem], run_id: str, now: float = 0.0
) -> list[ev.Event]:
    """A run ends: mail it claimed but never acknowledged is released, so it is due again."""
    require_registered(state)
    if state.current_run != run_id:
        raise LifecycleError("lifecycle:not_current_run", f"run {run_id} is not the session's current run")
    released = [
        _message_event(ev.ProducerMessageReleased, item, run_id, now)
        for item in sorted(mail.values(), key=lambda m: m.seq)
        if item.state == "claimed" and item.run_id == run_id
    ]
    return with_wake(state, [*released, ev.SessionRunFinished(at=now, run_id=run_id)], now)
