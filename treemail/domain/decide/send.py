"""decide_send: the model's send_message, from what the worker loaded to events or a refusal.

A little over the house's 200 lines: decide_send and the admission steps every agent send shares.
"""

import hashlib
from dataclasses import dataclass, field

from .. import blocks, digests, effective, loops, permissions, proof
from ..frozen import replace
from .. import events as ev
from ..commands import READ_RECEIPT, SendArguments, SendMessage
from ..errors import Code, Rejected
from ..messaging import MessagingConfig
from ..outbound import Sender, Source, recipient_state_label, sources
from ..records import SessionRecord
from ..state import SessionState
from . import backpressure, content, endings, guards, idempotency, ordering, routing
from . import loops as loop_guard
from . import mailcontrol
from .guards import Found, Target
from .wake import with_wake_folded


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
    # The idempotency record of this tool call, if it was decided before: it is answered from it.
    recorded: list | dict | None = None
    # The service-wide drain flag: the whole service is draining.
    service_draining: bool = False
    # The recipient's stream position the decision's events follow (where the sender's receipt points),
    # and the sender's, which its own records follow.
    target_version: int = 0
    sender_version: int = 0
    # Signs every accepted agent message (source proof); None: proofs are off.
    keyring: proof.Keyring | None = None
    # Loop detection: the nearest common ancestor of sender and recipient as the worker loaded it, when it is
    # neither of them (its notice is written on its stream), and whether the worker looked for one at all.
    ancestor: Sender | None = None
    ancestor_looked: bool = False


# Outcomes of a send decision.
@dataclass(frozen=True)
class Accepted:
    """Append ``events`` to the recipient's stream, with the idempotency record."""

    events: list[ev.Event]
    result: dict
    # The recipient's state after ``events``, folded by the decision (the append reuses it).
    state_after: SessionState | None = None
    # The sender's own records of the message (its receipt), on its stream in the same step.
    sources: list[Source] = field(default_factory=list)

    @property
    def sender_events(self) -> list[ev.Event]:
        return [event for source in self.sources for event in source.events]


@dataclass(frozen=True)
class Refused:
    code: Code
    message: str
    # A refusal recorded with the recipient's append stays inspectable under its own message id, and the
    # sender's record of it (``MessageRefused``) is appended in the same step.
    message_id: str = ""
    sources: list[Source] = field(default_factory=list)
    # Loop detection: events on the recipient's stream (its loop notice, when it is the nearest common
    # ancestor), and whether the worker must load the ancestor and decide again.
    events: list[ev.Event] = field(default_factory=list)
    ancestor_wanted: bool = False
    # Flow control: when to retry and the occupancy that refused it (a refusal that may pass later).
    backpressure: dict | None = None

    @property
    def sender_events(self) -> list[ev.Event]:
        return [event for source in self.sources for event in source.events]

    @property
    def recorded(self) -> bool:
        return idempotency.is_recorded(self.code)

    @property
    def recorded_alone(self) -> bool:
        return idempotency.is_recorded_alone(self.code)


@dataclass(frozen=True)
class Replayed:
    """A retried tool call: answered from its idempotency record, nothing decided again."""

    outcome: dict


@dataclass(frozen=True)
class AwaitsApproval:
    """Append ``events`` (the request, if it is new) to the sender's stream; the producer waits for a person."""

    events: list[ev.Event]
    request_id: str
    label: str


SendDecision = Accepted | Refused | AwaitsApproval | Replayed


def outcome_of(decision: SendDecision) -> dict:
    """What the producer is answered, and what the idempotency record keeps."""
    match decision:
        case Accepted(result=result):
            return {"ok": result}
        case Refused(code=code, message=message, message_id=message_id, backpressure=pressure):
            error = {"code": code.value, "message": message, **(pressure or {})}
            return {"error": {**error, "message_id": message_id} if message_id else error}
        case AwaitsApproval(request_id=request_id, label=label):
            return {"approval": {"request_id": request_id, "label": label}}
        case Replayed(outcome=outcome):
            return outcome
    raise AssertionError(decision)


def approval_fingerprint(recipient_session_id: str, arguments: SendArguments) -> str:
    """What a person approves: this recipient, this mode, this body; nothing else rides on it."""
    body = hashlib.sha256(arguments.body.encode()).hexdigest()
    return digests.digest([recipient_session_id, arguments.mode, body, *blocks.fingerprint_part(arguments.blocks)])


def decide_send(command: SendMessage, given: SendGiven) -> SendDecision:
    context, arguments, config = command.context, command.arguments, given.config
    if given.recorded is not None:
        # Before every check: a retry gets the original outcome whatever changed since.
        return Replayed(idempotency.replayed_outcome(given.recorded, arguments))
    overlay = given.sender_state.rules_overlay
    try:
        guards.require_not_blank(arguments.body)
        sender = guards.require_sender(given.sender, given.sender_state)
        endings.require_sender_admitted(given.sender_state, context.run_id, given.service_draining)
        guards.require_enabled(config)
        guards.require_tool(sender, overlay)
        content.require_content(arguments, config)
        endings.require_parent_available(sender, given.target)
        found = guards.require_recipient(sender, given.target, lambda peer: _may_address(sender, overlay, peer))
        endings.require_recipient_admitting(found, next_incarnation=True)
        routing.require_route(config.routing, sender, found.record)
        found = content.require_image_capable(sender, given.target, arguments)
        label = permissions.relationship(sender.origin, found.record.origin)
        effect = effective.effect(sender.rules, overlay, label)
        if effect == "deny":
            raise guards.permission_denied(label)
        if effect == "ask" and label not in given.tree_grants:
            waiting = _approval(command, given, sender, found, label)
            if waiting is not None:
                return waiting
        hop = admit(given, sender, found, context.run_id)
        loop_guard.require_no_loop(sender, given.sender_state, found, context.run_id, arguments.body)
    except Rejected as rejection:
        return refused(given, rejection)
    return numbered(accept(command, given, sender, found, hop), arguments, given.sender_state)


def numbered(accepted: Accepted, arguments: SendArguments, sender_state: SessionState) -> Accepted:
    """The answer a send's caller reads: exactly ``message_id``, ``mode`` and ``recipient_state``, so a
    model that was promised those three is never handed a fourth; the message's number in its pair
    (``sequence``) only where it means something to the caller: the sender has the read receipt tool,
    which counts to it, or the host asked for it (its own richer send). Decided here, so a retry of the
    tool call is answered with the same keys as the first."""
    if arguments.numbered or READ_RECEIPT in sender_state.installed_tools:
        return accepted
    result = {key: value for key, value in accepted.result.items() if key != "sequence"}
    return replace(accepted, result=result)


def refused(given: SendGiven, rejection: Rejected) -> Refused:
    """A refusal decided on the recipient's state is recorded with its append: it keeps a message id, and
    the sender records it too (its capacity and ``inspect`` see it). Any other refusal is the code alone.
    One that may pass later says when to retry, and why (``backpressure``)."""
    message, pressure = backpressure.explain(rejection, given)
    if not idempotency.is_recorded(rejection.code):
        return Refused(rejection.code, message, backpressure=pressure)
    recipient = given.target.record.session_id
    record = ev.MessageRefused(at=given.now, message_id=given.new_id, recipient_session_id=recipient,
                               code=rejection.code.value)
    if isinstance(rejection, loop_guard.LoopDetected):
        return _loop_refused(given, rejection, record)
    return Refused(rejection.code, message, given.new_id,
                   [Source(given.sender, given.sender_state, given.sender_version, [record])], backpressure=pressure)


def _loop_refused(given: SendGiven, rejection: "loop_guard.LoopDetected", record: ev.MessageRefused) -> Refused:
    """The refusal, and the loop notice on the nearest common ancestor's stream (written once per chain)."""
    sender, target = given.sender, given.target
    sender_events: list[ev.Event] = [record]
    recipient_events: list[ev.Event] = []
    sources: list[Source] = []
    ancestor = loop_guard.ancestor_of(sender, target.record)
    if ancestor is None and given.ancestor is None and not given.ancestor_looked:
        return Refused(rejection.code, rejection.message, given.new_id, ancestor_wanted=True)

    def notice(state: SessionState, ancestor_id: str) -> list[ev.Event]:
        return loop_guard.notice_events(state, rejection.chain, ancestor_id, sender, target.record, rejection.body,
                                        given.now)

    if ancestor == sender.session_id:
        sender_events += notice(given.sender_state, ancestor)
    elif ancestor == target.record.session_id:
        recipient_events = notice(target.state, ancestor)
    elif given.ancestor is not None:
        kept = given.ancestor
        sources.append(Source(kept.record, kept.state, kept.version, notice(kept.state, kept.record.session_id)))
    sources.insert(0, Source(sender, given.sender_state, given.sender_version, sender_events))
    return Refused(rejection.code, rejection.message, given.new_id, sources, events=recipient_events)


def admit(given: SendGiven, sender: SessionRecord, found: Found, run_id: str) -> int:
    """The guards every authorized agent send passes, tree mail and peer routes alike; returns its hop."""
    hop = guards.sending_hop(given.sender_state, run_id)
    guards.require_hops(hop, given.config)
    guards.require_source_capacity(given.sender_state, given.config)
    guards.require_inbox_room(found.state, given.config)
    guards.require_window_room(found.state, sender.session_id, given.config)
    return hop


def _may_address(sender: SessionRecord, overlay, peer) -> bool:
    """A peer is addressable when the sender's effective rules do not deny its label."""
    label = permissions.relationship(sender.origin, peer.record.origin)
    return effective.effect(sender.rules, overlay, label) != "deny"


def _approval(command: SendMessage, given: SendGiven, sender: SessionRecord, found: Found, label: str):
    """None when a person approved exactly this send; otherwise the request to wait on (opened if new)."""
    key = idempotency.key_digest(command.context)
    fingerprint = approval_fingerprint(found.record.session_id, command.arguments)
    entry = given.sender_state.approvals.get(key)
    if entry is None:
        request = ev.ApprovalRequested(
            at=given.now, request_id=given.new_id, key=key, fingerprint=fingerprint,
            sender_session_id=sender.session_id, sender_handle=sender.address,
            recipient_session_id=found.record.session_id, recipient_handle=found.record.address,
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


def thread(arguments) -> dict:
    """Tree mail that answers a message joins its thread (the host resolved it before the command was sent);
    peer mail names what it answers through its own provenance."""
    in_reply_to = getattr(arguments, "in_reply_to", None)
    if in_reply_to is None:
        return {}
    return {"in_reply_to": in_reply_to, "thread_id": getattr(arguments, "thread_id", None) or in_reply_to}


def accept(command, given: SendGiven, sender: SessionRecord, found: Found, hop: int,
           cause: tuple[str | None, str | None] | None = None, **provenance) -> Accepted:
    """The accepted message on the recipient's stream; ``provenance``: a peer route's principal, name, reference.
    ``cause``: (caused_by, chain_id) fixed when the message was sent (peer mail), else read from the sender's
    run now."""
    producer_id = ev.agent_producer_id(sender.session_id)
    caused_by, chain = cause if cause is not None else loops.cause_of(given.sender_state.run_causes,
                                                                      command.context.run_id)
    events: list[ev.Event] = []
    disposal = found.state.disposal
    if disposal == "closed":
        events.append(ev.SessionResumed(at=given.now))  # cold resume: the message starts its next incarnation
    # Supersede: the unclaimed older message with this key from this sender is settled in the same step.
    events += mailcontrol.superseded_events(found.state, sender.session_id,
                                            getattr(command.arguments, "supersede_key", None), given.new_id,
                                            given.now)
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
            blocks=blocks.to_json(command.arguments.blocks) if command.arguments.blocks else None,
            traceparent=getattr(command, "traceparent", "") or None,
            return_address=sender.session_id,
            next_incarnation=disposal == "closing",
            caused_by=caused_by,
            chain_id=chain,
            expires_at=mailcontrol.expires_at(given.now, getattr(command.arguments, "expires_in_s", None)),
            supersede_key=getattr(command.arguments, "supersede_key", None),
            # Order and priority: numbered here, in the recipient's atomic step, so the number follows its stream.
            pair_seq=ordering.next_number(found.state, sender.session_id),
            urgent=getattr(command.arguments, "urgent", False),
            **{**thread(command.arguments), **provenance},
        )
    )
    result = {
        "message_id": given.new_id,
        "mode": command.arguments.mode,
        "recipient_state": recipient_state_label(found.state.status),
        # Order and priority: the message's number in its pair, what a read receipt counts to (``numbered``
        # decides whether a send_message caller reads it).
        "sequence": events[-1].pair_seq,
    }
    events = proof.sign_events(events, found.record.session_id, given.keyring)
    events, after = with_wake_folded(found.state, events, given.now)
    receipts = sources(found.record.session_id, found.state.status, events, given.target_version,
                       {sender.session_id: Sender(sender, given.sender_state, given.sender_version)})
    return Accepted(events, result, after, receipts)
