"""decide_send: the model's send_message, from what the worker loaded to events or a refusal."""

import hashlib
import json
from dataclasses import dataclass

from .. import events as ev
from .. import permissions
from ..commands import SendArguments, SendMessage
from ..errors import Code, Rejected
from ..messaging import MessagingConfig
from ..records import SessionRecord
from ..state import SessionState
from . import admission, guards, idempotency
from .guards import Found, Target
from .wake import with_wake


@dataclass(frozen=True)
class SendGiven:
    """Everything a send is decided on, loaded by the worker in one round trip."""

    sender: SessionRecord | None
    sender_state: SessionState
    target: Target
    config: MessagingConfig
    # Labels a person approved for the sender's whole tree.
    tree_grants: frozenset[str] = frozenset()
    # A fresh id: the message's if accepted, the approval request's if one is opened.
    new_id: str = ""
    now: float = 0.0
    # Seed 002: the whole service is draining.
    service_draining: bool = False


# Outcomes of a send decision.
@dataclass(frozen=True)
class Accepted:
    """Append ``events`` to the recipient's stream, with the idempotency record."""

    events: list[ev.Event]
    result: dict


@dataclass(frozen=True)
class Refused:
    code: Code
    message: str

    @property
    def recorded(self) -> bool:
        return idempotency.is_recorded(self.code)


@dataclass(frozen=True)
class AwaitsApproval:
    """Append ``events`` (the request, if it is new) to the sender's stream; the producer waits for a person."""

    events: list[ev.Event]
    request_id: str
    label: str


SendDecision = Accepted | Refused | AwaitsApproval


def outcome_of(decision: SendDecision) -> dict:
    """What the producer is answered, and what the idempotency record keeps."""
    match decision:
        case Accepted(result=result):
            return {"ok": result}
        case Refused(code=code, message=message):
            return {"error": {"code": code.value, "message": message}}
        case AwaitsApproval(request_id=request_id, label=label):
            return {"approval": {"request_id": request_id, "label": label}}
    raise AssertionError(decision)


def recipient_state_label(status: str) -> str:
    return {"running": "running", "queued": "queued"}.get(status, "waking_finished")


def approval_fingerprint(recipient_session_id: str, arguments: SendArguments) -> str:
    """What a person approves: this recipient, this mode, this body; nothing else rides on it."""
    body = hashlib.sha256(arguments.body.encode()).hexdigest()
    raw = json.dumps([recipient_session_id, arguments.mode, body])
    return hashlib.sha256(raw.encode()).hexdigest()[:32]


def agent_producer_id(sender_session_id: str) -> str:
    return f"agent:{sender_session_id}"


def decide_send(command: SendMessage, given: SendGiven) -> SendDecision:
    context, arguments, config = command.context, command.arguments, given.config
    try:
        sender = guards.require_sender(given.sender, given.sender_state)
        admission.require_sender_admitted(given.sender_state, context.run_id, given.service_draining)
        guards.require_enabled(config)
        guards.require_tool(sender)
        guards.require_body(arguments.body, config.max_body_bytes)
        admission.require_parent_available(sender, given.target)
        found = guards.require_recipient(sender, given.target)
        admission.require_recipient_admitting(found)
        label = permissions.relationship(sender.origin, found.record.origin)
        effect = permissions.evaluate(sender.rules, label)
        if effect == "deny":
            raise guards.permission_denied(label)
        if effect == "ask" and label not in given.tree_grants:
            waiting = _approval(command, given, sender, found, label)
            if waiting is not None:
                return waiting
        hop = guards.sending_hop(given.sender_state, context.run_id)
        guards.require_hops(hop, config)
        guards.require_inbox_room(found.state, config)
        guards.require_window_room(found.state, sender.session_id, config)
    except Rejected as rejection:
        return Refused(rejection.code, rejection.message)
    return _accept(command, given, sender, found, hop)


def _approval(command: SendMessage, given: SendGiven, sender: SessionRecord, found: Found, label: str):
    """None when a person approved exactly this send; otherwise the request to wait on (opened if new)."""
    key = idempotency.key_digest(command.context)
    fingerprint = approval_fingerprint(found.record.session_id, command.arguments)
    entry = given.sender_state.approvals.get(key)
    if entry is None:
        request = ev.ApprovalRequested(
            at=given.now, request_id=given.new_id, key=key, fingerprint=fingerprint,
            sender_session_id=sender.session_id, sender_handle=sender.handle,
            recipient_session_id=found.record.session_id, recipient_handle=found.record.handle,
            label=label, body=command.arguments.body, mode=command.arguments.mode,
        )
        return AwaitsApproval([request], given.new_id, label)
    if entry.fingerprint != fingerprint:
        # The same tool call, other arguments: the approval never covers what the person did not see.
        raise Rejected(Code.IDEMPOTENCY_CONFLICT, idempotency.CONFLICT_MESSAGE)
    if entry.status == "pending":
        return AwaitsApproval([], entry.request_id, label)
    if entry.status == "denied":
        raise guards.permission_denied(label)
    return None


def _accept(command: SendMessage, given: SendGiven, sender: SessionRecord, found: Found, hop: int) -> Accepted:
    producer_id = agent_producer_id(sender.session_id)
    events: list[ev.Event] = []
    if producer_id not in found.state.producers:
        events.append(
            ev.ProducerRegistered(
                at=given.now, producer_id=producer_id, owner="agent", sender_session_id=sender.session_id
            )
        )
    events.append(
        ev.ProducerMessageAccepted(
            at=given.now,
            message_id=given.new_id,
            producer_id=producer_id,
            owner="agent",
            sender_session_id=sender.session_id,
            sender_handle=sender.handle,
            body=command.arguments.body,
            mode=command.arguments.mode,
            agent_hop=hop,
            run_id=command.context.run_id,
            tool_call_id=command.context.tool_call_id,
        )
    )
    result = {
        "message_id": given.new_id,
        "mode": command.arguments.mode,
        "recipient_state": recipient_state_label(found.state.status),
    }
    return Accepted(with_wake(found.state, events, given.now), result)
