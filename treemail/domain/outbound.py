"""The sender's side of a message (mail as an obligation): its record of each send intent, the index inspect reads,
and the status a sender, its controllers or the host are shown. Pure.

The recipient's stream holds the message's delivery (accepted, claimed,
released, parked, consumed...). The sender's stream holds what its capacity
and ``inspect`` need: ``MessageSent`` (the destination's receipt),
``MessageRefused`` and ``MessageSettled``, written in the same atomic step as
the recipient's events that imply them, so the two streams never disagree.
"""

import re
from collections.abc import Collection, Mapping
from dataclasses import dataclass

from . import events as ev
from .messaging import MessagingConfig
from .records import SessionRecord
from .state import MailItem, SessionState

REASON_LIMIT = 120
_UNPRINTABLE = re.compile(r"[\x00-\x1f\x7f]+")


def recipient_state_label(status: str) -> str:
    # Idle groups with queued ("queued durably if idle or queued"); an idle recipient is still woken.
    return {"running": "running", "queued": "queued", "idle": "queued"}.get(status, "waking_finished")


def bounded(text: str | None) -> str:
    """A reason fit to show anyone allowed to inspect: one line, at most REASON_LIMIT characters."""
    text = _UNPRINTABLE.sub(" ", text or "").strip()
    return text if len(text) <= REASON_LIMIT else text[: REASON_LIMIT - 1] + "…"


def source_events(recipient_id: str, recipient_status: str, events: list[ev.Event], version: int,
                  peer_mail: Collection[str] = ()) -> dict[str, list[ev.Event]]:
    """sender session id -> the records the recipient's ``events`` (appended after ``version``) imply.

    Peer mail implies none (``peer_mail``: the ids of the peer messages the decision read): its sender's
    records come back through a driver (``outbox.py``), even when sender and recipient share a slot, so
    the sender's count never drops twice for one message."""
    out: dict[str, list[ev.Event]] = {}
    for seq, event in enumerate(events, start=version + 1):
        sender = getattr(event, "sender_session_id", None)
        if getattr(event, "owner", None) != "agent" or sender is None:
            continue
        if getattr(event, "principal", None) is not None or getattr(event, "message_id", None) in peer_mail:
            continue
        match event:
            case ev.ProducerMessageAccepted():
                record = ev.MessageSent(at=event.at, message_id=event.message_id, recipient_session_id=recipient_id,
                                        position=seq, recipient_state=recipient_state_label(recipient_status),
                                        pair_seq=event.pair_seq)
            case ev.ProducerMessageConsumed():
                record = ev.MessageSettled(at=event.at, message_id=event.message_id,
                                           recipient_session_id=recipient_id, outcome="consumed")
            case ev.ProducerMessageDiscarded():
                record = ev.MessageSettled(at=event.at, message_id=event.message_id,
                                           recipient_session_id=recipient_id, outcome="discarded",
                                           reason=bounded(event.reason))
            case ev.ProducerMessageRestored():
                # A revert undid its consumption: the intent is unsettled again, and counts again.
                record = ev.MessageSent(at=event.at, message_id=event.message_id, recipient_session_id=recipient_id,
                                        position=event.accepted_seq, recipient_state=recipient_state_label(recipient_status))
            case _:
                continue
        out.setdefault(sender, []).append(record)
    return out


@dataclass(frozen=True)
class Sender:
    """A sender's stream as a decision read it: its records of the decision are appended after ``version``."""

    record: SessionRecord
    state: SessionState
    version: int


@dataclass(frozen=True)
class Source(Sender):
    """A sender's records of this decision, and the state they are appended to (its stream's position)."""

    events: list[ev.Event]


def mail_senders(_command, mail: Mapping[str, MailItem], _history=()) -> set[str]:
    """The senders of the agent mail a decision read: a settlement of any of it is recorded on their streams."""
    return {item.sender_session_id for item in mail.values()
            if item.owner == "agent" and item.sender_session_id and not item.peer}


def peer_mail(mail: Mapping[str, MailItem]) -> frozenset[str]:
    """The ids of the peer messages among ``mail``: their settlements go back through a driver."""
    return frozenset(message_id for message_id, item in mail.items() if item.peer)


def settled_peer_sources(mail: Mapping[str, MailItem], events: list[ev.Event]) -> set[str]:
    """The sources of the peer messages ``events`` consume or discard: each one's driver can settle it now."""
    settled = (mail.get(e.message_id) for e in events
               if isinstance(e, ev.ProducerMessageConsumed | ev.ProducerMessageDiscarded))
    return {item.sender_session_id for item in settled if item is not None and item.peer and item.sender_session_id}


def sources(recipient_id: str, recipient_status: str, events: list[ev.Event], version: int,
            senders: Mapping[str, Sender | None], peer_ids: Collection[str] = (),
            elsewhere: Mapping[str, list[ev.Event]] | None = None) -> list[Source]:
    """Each sender's records of ``events`` (``source_events``), on the stream the decision read it at.

    ``senders``: every sender the decision looked up; None for one whose stream the same atomic step cannot
    write (gone, or in another partition). Peer mail implies no record here at all (``peer_ids``): a driver
    brings its settlement back to its sender (``outbox.py``), which counts it until then. A record
    for a sender the decision never looked up is a command that did not declare the senders it reads, never
    a record to drop quietly.
    """
    out: list[Source] = []
    writes = source_events(recipient_id, recipient_status, events, version, peer_ids)
    # Other events the decision writes there (a settlement notice to a parent), after the records.
    for session_id, more in (elsewhere or {}).items():
        writes[session_id] = [*writes.get(session_id, []), *more]
    for sender_id, records in writes.items():
        if sender_id not in senders:
            raise AssertionError(f"the decision implies records for sender {sender_id} it did not read")
        sender = senders[sender_id]
        if sender is not None:
            out.append(Source(sender.record, sender.state, sender.version, records))
    return out


# What ``index_entries`` passes by its exact type (``events.other_types``): every send's accepted message.
_NOT_INDEXED = ev.other_types(ev.MessageSent, ev.MessageRefused, ev.PeerIntentStored, ev.MessageSettled)


def index_entries(sender_id: str, events: list[ev.Event], first_position: int) -> list[str]:
    """(field, value) pairs of the partition's outbound index that the sender's ``events`` write, the first
    of them at ``first_position`` on its stream.

    A value names where the record is, "<sender> <position>", not a copy of it: inspect reads the record
    from the sender's stream (the copy cost more memory per message than the record itself).
    """
    pairs: list[str] = []
    for position, event in enumerate(events, start=first_position):
        if type(event) in _NOT_INDEXED:
            continue
        match event:
            case ev.MessageSent() | ev.MessageRefused() | ev.PeerIntentStored():
                pairs.extend((event.message_id, f"{sender_id} {position}"))
            case ev.MessageSettled():
                pairs.extend((f"{event.message_id}:settled", f"{sender_id} {position}"))
    return pairs


def index_reference(value: str) -> tuple[str, int]:
    """(sender session id, position of the record on its stream) of an index value."""
    sender_id, _, position = value.partition(" ")
    return sender_id, int(position)


def may_inspect(caller_id: str | None, sender_id: str, sender_ancestors: list[str]) -> bool:
    """The host (no caller), the sender, or a session it was delegated from (its controllers)."""
    return caller_id is None or caller_id == sender_id or caller_id in sender_ancestors


def status_of(message_id: str, sender_id: str, sent: ev.MessageSent | ev.MessageRefused,
              settled: ev.MessageSettled | None, item: MailItem | None, policy: MessagingConfig, now: float) -> dict:
    """What inspect answers: accepted (with the receipt), processed (with the settlement), parked or refused."""
    out: dict = {"message_id": message_id, "sender_session_id": sender_id}
    if isinstance(sent, ev.MessageRefused):
        return {**out, "status": "refused", "recipient_session_id": sent.recipient_session_id, "reason": sent.code}
    out["receipt"] = {"recipient_session_id": sent.recipient_session_id, "position": sent.position,
                      "recipient_state": sent.recipient_state, "accepted_at": sent.at}
    if sent.pair_seq is not None:
        out["receipt"]["sequence"] = sent.pair_seq  # order and priority: what the read receipt counts to
    if getattr(sent, "code_version", None):
        out["code_version"] = sent.code_version  # peer mail: the code version its intent was stored with
    if settled is not None:
        return {**out, "status": "processed", "reason": settled.reason or None,
                "settlement": {"outcome": settled.outcome, "reason": settled.reason, "at": settled.at}}
    if item is None:
        return {**out, "status": "accepted", "reason": None}
    out.update(attempts=item.attempts, delivery=item.state, reason=item.reason or None)
    if item.stranded:
        out["stranded"] = item.stranded  # no rule can end it any more: the pump reported it (a cancel ends it)
    if item.state == "parked":
        return {**out, "status": "parked"}
    out["status"] = "accepted"
    if item.retry_at > now:
        out["next_attempt_at"] = item.retry_at
    if item.since > 0:
        out["deadline_at"] = item.since + policy.delivery_deadline_s
    return out
