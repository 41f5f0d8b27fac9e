"""Peer mail as an outbox: each step a driver takes on a delivery, decided on one stream. Pure.

On the source's stream (``Given``): advance a delivery by the policy
(``outbox.next_step``), record the destination's answer to an attempt, record
its settlement, renew a parked budget. On the destination's stream
(``AdmissionGiven``): the admission itself, decided by the send's own guards
on the destination's state (its loop rule too), with the identity, input, principal
and hop the intent stored; the commit keys it by the message id, so a second attempt
after a lost reply is answered with the first receipt, never a second message.
"""

from dataclasses import dataclass

from .. import events as ev
from .. import grants, notices, outbox, peerinput
from ..commands import (DiscardPeerDelivery, DrivePeerDelivery, PeerSendArguments, RecordPeerAdmission, RetryPeerDelivery, SendContext,
                        SendToPeer, SettlePeerDelivery)
from ..errors import Code, LifecycleError, Rejected
from ..outbound import bounded
from ..records import SessionRecord
from ..state import SessionState
from . import endings, guards, send
from . import loops as loop_guard
from .disposal import returned_notice
from .guards import Found
from .lifecycle import Given, require_registered
from .routes import require_peer
from .send import Accepted, Refused, SendGiven


def _row(given: Given, message_id: str) -> outbox.Row | None:
    require_registered(given.state)
    return given.state.outbox.get(message_id)


def decide_drive(command: DrivePeerDelivery, given: Given) -> list[ev.Event]:
    row = _row(given, command.message_id)
    step = outbox.next_step(row, given.config, given.now) if row is not None else None
    if step is None or step.action == "settle":
        return []
    if step.action == "attempt":
        return [ev.PeerAttemptStarted(at=given.now, message_id=row.message_id, attempt=step.attempt)]
    if step.action == "park":
        return [ev.PeerDeliveryParked(at=given.now, message_id=row.message_id, reason=bounded(step.reason))]
    return _failed(row, step.attempt, step.reason, given)


def _failed(row: outbox.Row, attempt: int, reason: str, given: Given) -> list[ev.Event]:
    """A failed attempt backs off; the last one allowed parks the delivery with its reason."""
    events: list[ev.Event] = [ev.PeerAttemptFailed(
        at=given.now, message_id=row.message_id, attempt=attempt, reason=bounded(reason),
        retry_at=given.now + outbox.backoff_delay(given.config, attempt),
    )]
    if attempt >= given.config.max_attempts and outbox.spends_budget(reason):
        events.append(ev.PeerDeliveryParked(at=given.now, message_id=row.message_id,
                                            reason=bounded(f"attempts: {reason}")))
    return events


def decide_record_admission(command: RecordPeerAdmission, given: Given) -> list[ev.Event]:
    """A receipt is recorded whichever attempt earned it (the admission happened); a refusal or a failure
    only while the delivery still waits on that very attempt (a later one, or a retry, supersedes it)."""
    row = _row(given, command.message_id)
    if row is None or row.status == "accepted":
        return []
    if command.outcome == "accepted":
        return [ev.MessageSent(at=given.now, message_id=row.message_id, recipient_session_id=row.destination,
                               position=command.position, recipient_state=command.recipient_state, peer=row.peer,
                               pair_seq=command.sequence, code_version=row.code_version or None)]
    if not outbox.in_flight(row) or row.attempts != command.attempt:
        return []
    if command.outcome == "refused":
        refused = ev.MessageRefused(at=given.now, message_id=row.message_id, recipient_session_id=row.destination,
                                    code=bounded(command.code), peer=row.peer)
        # Its sender was told the message was stored, and a model never polls: it is told of the refusal.
        told = returned_notice(given, command.notice_id, notices.peer_refused_text(
            row.peer, row.message_id, bounded(command.code))) if command.notice_id else []
        return [refused, *told]
    return _failed(row, command.attempt, command.code, given)


def decide_settle_peer(command: SettlePeerDelivery, given: Given) -> list[ev.Event]:
    row = _row(given, command.message_id)
    if row is None or row.status != "accepted":
        return []
    return [ev.MessageSettled(at=given.now, message_id=row.message_id, recipient_session_id=row.destination,
                              outcome=command.outcome, reason=bounded(command.reason))]


def decide_retry_peer(command: RetryPeerDelivery, given: Given) -> list[ev.Event]:
    """Only a parked delivery is renewed: a refused or processed one is gone from the outbox for good."""
    row = _row(given, command.message_id)
    if row is None:
        raise LifecycleError("retry_message:settled", f"message {command.message_id} was already processed or "
                                                      "refused; it cannot be retried, send a new one")
    if row.status != "parked":
        raise LifecycleError("retry_message:not_parked", f"message {command.message_id} is {row.status}, not parked")
    return [ev.PeerDeliveryRetried(at=given.now, message_id=row.message_id)]


def decide_discard_peer(command: DiscardPeerDelivery, given: Given) -> list[ev.Event]:
    """Only a parked delivery is given up: no attempt of it is in flight, so none can land after it."""
    row = _row(given, command.message_id)
    if row is None:
        raise LifecycleError("retry_message:settled", f"message {command.message_id} was already processed or "
                                                      "refused")
    if row.status != "parked":
        raise LifecycleError("retry_message:not_parked", f"message {command.message_id} is {row.status}, not "
                                                         "parked; only a parked delivery can be discarded")
    return [ev.MessageSettled(at=given.now, message_id=row.message_id, recipient_session_id=row.destination,
                              outcome="discarded", reason=bounded(command.reason or "discarded by the host"))]


# ---- the admission, on the destination ------------------------------------------------------------


@dataclass(frozen=True)
class AdmissionGiven:
    """What an admission attempt is decided on: the stored intent, its source, the destination as read now."""

    intent: ev.PeerIntentStored
    sender: SessionRecord
    sender_state: SessionState
    target: Found | None
    config: object
    now: float = 0.0
    target_version: int = 0
    service_draining: bool = False
    keyring: object = None


def recorded_cause(intent: ev.PeerIntentStored) -> tuple[str | None, str | None] | None:
    """(caused_by, chain_id) as the intent recorded them when it was sent; None for an intent stored before
    they were recorded (its sender's run is read at admission instead)."""
    if intent.chain_id is None:
        return None
    return intent.caused_by, None if intent.chain_id == intent.message_id else intent.chain_id


def decide_admission(given: AdmissionGiven) -> Accepted | Refused:
    """The destination's side: the route, the grant (a reply was authorized on the source), the input, the
    destination admitting and its room. ``Refused`` with a code in ``outbox.TRANSIENT`` may pass later."""
    intent = given.intent
    try:
        if given.target is None or not given.target.state.registered:
            raise Rejected(Code.UNKNOWN_SESSION, "the destination is not registered")
        if given.service_draining:
            raise Rejected(Code.DRAINING, "the service is draining")
        # Past the source's own cutoff: its disposal ends what it stored and had not delivered yet.
        endings.require_sender_open(given.sender_state)
        found, route = require_peer(given.sender, given.target, intent.peer)
        endings.require_recipient_admitting(found)
        if not intent.reply:
            grants.require(found.state.peers, given.sender.agent_type, given.sender.session_id, "send", intent.peer)
        peerinput.require_input(route.input_schema, intent.body, intent.peer)
        guards.require_inbox_room(found.state, given.config)
        guards.require_peer_inbox_room(found.state)
        guards.require_window_room(found.state, given.sender.session_id, given.config)
        # The loop rule on the destination's memory as committed: a refusal here is definite, and the
        # source's outbox records it (``send_message:loop_detected``).
        loop_guard.require_no_loop(given.sender, given.sender_state, found, intent.run_id, intent.body,
                                   recorded_cause(intent))
    except Rejected as rejection:
        return Refused(rejection.code, rejection.message)
    command = SendToPeer(
        SendContext(given.sender.session_id, intent.run_id or "", intent.tool_call_id or ""),
        PeerSendArguments(intent.peer, intent.body, intent.mode, intent.in_reply_to, intent.reply),
        # Admitted in its sender's trace: the destination's claim and consume continue it.
        traceparent=intent.traceparent or "",
    )
    send_given = SendGiven(
        sender=given.sender, sender_state=given.sender_state, target=found, config=given.config,
        new_id=intent.message_id, now=given.now, target_version=given.target_version, keyring=given.keyring,
    )
    # The intent as stored, whichever attempt this is: destination, input, principal, cause and code version.
    provenance = {"code_version": intent.code_version} if intent.code_version else {}
    accepted = send.accept(command, send_given, given.sender, found, intent.agent_hop, recorded_cause(intent),
                           principal=intent.principal, **provenance, peer=intent.peer, in_reply_to=intent.in_reply_to,
                           reply=intent.reply)
    position = given.target_version + 1 + next(
        i for i, e in enumerate(accepted.events) if isinstance(e, ev.ProducerMessageAccepted))
    result = {"message_id": intent.message_id, "position": position,
              "recipient_state": accepted.result["recipient_state"], "sequence": accepted.result["sequence"]}
    # The receipt goes back to the source by the driver: nothing of this step is written on its stream.
    return Accepted(accepted.events, result, accepted.state_after)
