"""Mail that expires, is superseded, or is cancelled. Pure.

All three are opt-in (host send options and a host cancel); each ends a message the same way a discard
does, with a bounded reason its sender reads in its settlement (``inspect``, the history):

- **expiry**: a message sent with ``expires_in_s`` expires that long after it was accepted. From then on a
  claim skips it (``claimable_now``: an expired message never reaches a model), and the pump, which
  looks at the session at its expiry (``check_time``), settles it as ``expired`` (``expired_events``).
  A message already claimed when it expires was delivered: it is left to its attempt.
- **supersede**: a message sent with a ``supersede_key`` replaces the unclaimed older message from the same
  sender with the same key (latest wins): the older one is settled as ``superseded`` in the step that
  accepts the newer one. A claimed, consumed or discarded older one is not touched.
- **cancel**: ``CancelMail`` is decided on the recipient's stream, under its etag, so a claim and a cancel
  are ordered there: a message not yet claimed is settled as ``cancelled``; one a claim took (or that
  was already processed) answers ``already_delivered``. Both answers are recorded (``MessageCancelAnswered``).
"""

import dataclasses
from collections.abc import Mapping

from .. import events as ev
from ..commands import CancelMail, CancelPeerDelivery
from ..errors import Code, InvalidRequest, LifecycleError, Rejected
from ..outbound import bounded
from ..limits import MAX_IDEMPOTENCY_KEY_BYTES
from ..state import MailItem, SessionState, supersede_entry

EXPIRED = "expired"
SUPERSEDED = "superseded"
CANCELLED = "cancelled"
# How a cancel names a message its recipient had processed before it (any other settlement is a discard reason).
CONSUMED = "consumed"
# Not delivered yet: a cancel or an expiry still keeps it from every model.
UNDELIVERED = ("accepted", "admitted", "released", "parked")
# A send option's bounds: an expiry of at most a week, a key of an identifier's length.
MAX_EXPIRY_S = 7 * 24 * 3600.0
MAX_SUPERSEDE_KEY_BYTES = MAX_IDEMPOTENCY_KEY_BYTES


def _invalid(message: str) -> InvalidRequest:
    return InvalidRequest(Code.INVALID_ARGUMENTS.value, message)


def require_send_options(expires_in_s, supersede_key) -> None:
    """Bad options are refused before anything is stored (``InvalidRequest``, worded for the host)."""
    if expires_in_s is not None:
        if isinstance(expires_in_s, bool) or not isinstance(expires_in_s, (int, float)) or not (
                0 < expires_in_s <= MAX_EXPIRY_S):
            raise _invalid(f"expires_in_s must be a number of seconds in (0, {MAX_EXPIRY_S:.0f}], got {expires_in_s!r}")
    if supersede_key is not None:
        if not isinstance(supersede_key, str) or not supersede_key.strip() or not supersede_key.isprintable() \
                or len(supersede_key.encode()) > MAX_SUPERSEDE_KEY_BYTES:
            raise _invalid(f"supersede_key must be one printable line of 1 to {MAX_SUPERSEDE_KEY_BYTES} bytes")


def with_send_options(arguments, expires_in_s: float | None, supersede_key: str | None):
    """The parsed arguments with the host's send options; bad options are ``send_message:invalid_arguments``."""
    try:
        require_send_options(expires_in_s, supersede_key)
    except InvalidRequest as error:
        raise Rejected(Code.INVALID_ARGUMENTS, error.message) from None
    return dataclasses.replace(arguments, expires_in_s=None if expires_in_s is None else float(expires_in_s),
                               supersede_key=supersede_key)


def expires_at(now: float, expires_in_s: float | None) -> float | None:
    return None if expires_in_s is None else now + expires_in_s


def is_expired(item: MailItem, now: float) -> bool:
    return item.expires_at > 0 and item.expires_at <= now


def claimable_now(item: MailItem, now: float) -> bool:
    """The claim-time filter: an expired message is never handed to a model. (A cancelled or superseded one
    is no longer pending at all.)"""
    return not is_expired(item, now)


def check_time(item: MailItem) -> list[float]:
    """When the pump must look at an undelivered message to settle its expiry."""
    return [item.expires_at] if item.expires_at > 0 and item.state in UNDELIVERED else []


def _discarded(item: MailItem, reason: str, now: float) -> ev.ProducerMessageDiscarded:
    return ev.ProducerMessageDiscarded(at=now, message_id=item.message_id, owner=item.owner,
                                       sender_session_id=item.sender_session_id, agent_hop=item.agent_hop,
                                       run_id=item.run_id, reason=reason)


def expired_events(mail: Mapping[str, MailItem], now: float) -> list[ev.Event]:
    """Every undelivered message whose expiry passed, settled as expired (the pump's timed rule)."""
    return [_discarded(item, EXPIRED, now) for item in sorted(mail.values(), key=lambda m: m.seq)
            if item.state in UNDELIVERED and is_expired(item, now)]


def superseded_events(state: SessionState, sender_id: str, key: str | None, newer_id: str,
                      now: float) -> list[ev.Event]:
    """The unclaimed older message this sender sent with ``key``, settled as superseded by ``newer_id``;
    nothing if none."""
    if not key:
        return []
    older = state.superseding.get(supersede_entry(sender_id, key))
    if older is None:
        return []
    return [ev.ProducerMessageDiscarded(at=now, message_id=older, owner="agent", sender_session_id=sender_id,
                                        reason=SUPERSEDED, superseded_by=newer_id)]


def expiring_senders(_command, mail: Mapping[str, MailItem], _history=()) -> set[str]:
    """The senders of the mail that may expire (``Handler.reads_senders`` of the pump's pass): an expired
    message is settled with its sender in the same step. Mail without an expiry costs the pass nothing."""
    return {item.sender_session_id for item in mail.values()
            if item.expires_at > 0 and item.owner == "agent" and item.sender_session_id and not item.peer}


def decide_cancel(command: CancelMail, given) -> list[ev.Event]:
    """Cancelled if no claim took it yet; ``already_delivered`` once one did or it was processed. A message
    settled before the cancel (``command.settled``, from its sender's record) is answered as it was settled:
    discarded ones (expired, superseded, cancelled) answer ``cancelled``, consumed ones ``already_delivered``;
    that answer is recorded too, so the history shows every cancel asked, whatever came of it."""
    if not given.state.registered:
        raise LifecycleError("lifecycle:unknown_session", f"session {command.session_id} is not registered")
    item = given.mail.get(command.message_id)
    if item is not None and item.state in UNDELIVERED:
        return [_discarded(item, CANCELLED, given.now),
                ev.MessageCancelAnswered(at=given.now, message_id=command.message_id, outcome="cancelled",
                                         by=command.by)]
    if command.settled:
        return [_settled_answer(command, given.now)]
    return [ev.MessageCancelAnswered(at=given.now, message_id=command.message_id, outcome="already_delivered",
                                     by=command.by)]


def _settled_answer(command: CancelMail | CancelPeerDelivery, now: float) -> ev.MessageCancelAnswered:
    """The answer to a cancel of a message settled before it: a discarded one was never delivered."""
    outcome = "already_delivered" if command.settled == CONSUMED else "cancelled"
    return ev.MessageCancelAnswered(at=now, message_id=command.message_id, outcome=outcome, by=command.by,
                                    settled=bounded(command.settled))


def decide_cancel_peer(command: CancelPeerDelivery, given) -> list[ev.Event]:
    """Peer mail not admitted yet, on its source: cancelled unless an admission attempt is in flight (then the
    destination may be admitting it right now: ``cancel_message:in_flight``, ask again once it is answered).
    A delivery that is no longer in the outbox was admitted or refused: ``already_delivered``."""
    row = given.state.outbox.get(command.message_id)
    if command.settled:
        return [_settled_answer(command, given.now)]
    if row is None or row.status == "accepted":
        return [ev.MessageCancelAnswered(at=given.now, message_id=command.message_id, outcome="already_delivered",
                                         by=command.by)]
    if row.started_at > 0:
        raise LifecycleError(Code.CANCEL_IN_FLIGHT.value, f"message {command.message_id} has an admission attempt "
                                                          "in flight; cancel it again once the attempt is answered")
    return [ev.MessageSettled(at=given.now, message_id=row.message_id, recipient_session_id=row.destination,
                              outcome="discarded", reason=bounded(CANCELLED)),
            ev.MessageCancelAnswered(at=given.now, message_id=command.message_id, outcome="cancelled", by=command.by)]
