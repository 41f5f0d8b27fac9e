"""Peer mail as an outbox: the source's rows of its peer send intents, and the delivery policy. Pure.

A peer send crosses slots, so it is three single-slot steps, each under one
stream's etag:

1. *pending*: ``PeerIntentStored`` on the source (exact live sender,
   idempotency, the per-source capacity, the row);
2. *admission attempts* by a driver: ``PeerAttemptStarted`` on the source,
   then one commit on the destination keyed by the message id (the admission
   identity, the same on every attempt, so a lost reply never admits twice),
   then the answer recorded on the source: ``MessageSent`` (the receipt),
   ``MessageRefused`` (definite), or ``PeerAttemptFailed`` (backoff; parked
   after the attempts or the deadline);
3. *status back*: once the destination consumed or discarded it, the driver
   records ``MessageSettled`` and the row (and its capacity) is released.

A row lives in the source's state from its intent until it is processed or
refused; its history stays on the stream and in the outbound index.
"""

from dataclasses import dataclass

from . import events as ev
from .frozen import replace
from .messaging import MessagingConfig

STATUSES = ("pending", "parked", "accepted")
# A destination's refusal that may pass later: the attempt failed, the delivery is tried again.
TRANSIENT = frozenset({
    "send_message:inbox_full", "send_message:inflight_full", "send_message:draining",
    "send_message:engine_shutdown", "peer_message:engine_shutdown", "peer_message:inbox_full",
})
ATTEMPT_TIMEOUT = "attempt_timeout"
# A drain is an operator's pause, not a failure of the delivery: an attempt it refused is tried again after its
# backoff and does not spend the budget of attempts (the deadline still holds), so the delivery goes on after
# the drain is lifted instead of waiting parked for a retry.
DEFERRED = frozenset({"send_message:draining"})


def spends_budget(reason: str) -> bool:
    """Whether an attempt that failed for ``reason`` counts against ``max_attempts``."""
    return reason not in DEFERRED


@dataclass(frozen=True)
class Row:
    message_id: str
    destination: str
    peer: str
    status: str = "pending"
    attempts: int = 0
    # When the budget started (the intent, or the last retry): the deadline runs from here.
    since: float = 0.0
    # The attempt in flight started then (0: none in flight).
    started_at: float = 0.0
    retry_at: float = 0.0
    reason: str = ""
    # Accepted: when, and the accepted event's position on the destination's stream.
    accepted_at: float = 0.0
    position: int = 0
    # The code version its intent was stored with ("": none): what inspect shows at every stage.
    code_version: str = ""

    def to_list(self) -> list:
        row = [self.message_id, self.destination, self.peer, self.status, self.attempts, self.since,
               self.started_at, self.retry_at, self.reason, self.accepted_at, self.position]
        # Written only when there is one: a row without it reads as it did before.
        return [*row, self.code_version] if self.code_version else row

    @classmethod
    def from_list(cls, data: list) -> "Row":
        return cls(*data)


FOLDED = frozenset({ev.PeerIntentStored, ev.PeerAttemptStarted, ev.PeerAttemptFailed, ev.PeerDeliveryParked,
                    ev.PeerDeliveryRetried})


def evolve(rows: dict[str, Row], event: ev.Event) -> dict[str, Row]:
    """The outbox after one of its own events (``FOLDED``); receipts, refusals and
    settlements are folded by ``state.evolve``, which also keeps the capacity."""
    match event:
        case ev.PeerIntentStored():
            row = Row(event.message_id, event.destination_session_id, event.peer, since=event.at,
                      code_version=event.code_version or "")
            return {**rows, event.message_id: row}
    row = rows.get(getattr(event, "message_id", ""))
    if row is None:
        return rows
    match event:
        case ev.PeerAttemptStarted():
            row = replace(row, attempts=event.attempt, started_at=event.at, retry_at=0.0)
        case ev.PeerAttemptFailed():
            row = replace(row, started_at=0.0, retry_at=event.retry_at, reason=event.reason)
        case ev.PeerDeliveryParked():
            row = replace(row, status="parked", started_at=0.0, reason=event.reason)
        case ev.PeerDeliveryRetried():
            row = replace(row, status="pending", attempts=0, since=event.at, started_at=0.0, retry_at=0.0,
                          reason="retried")
        case _:
            return rows
    return {**rows, row.message_id: row}


def accepted(rows: dict[str, Row], event: ev.MessageSent) -> dict[str, Row]:
    row = rows[event.message_id]
    row = replace(row, status="accepted", started_at=0.0, accepted_at=event.at, position=event.position, reason="")
    return {**rows, row.message_id: row}


def without(rows: dict[str, Row], message_id: str) -> dict[str, Row]:
    return {k: v for k, v in rows.items() if k != message_id}


# ---- the delivery policy (the clock is ``now``) --------------------------------------------------------


def backoff_delay(policy: MessagingConfig, attempts: int) -> float:
    """Exponential from ``backoff_initial_s`` after the first failed attempt, capped at ``backoff_max_s``."""
    return min(policy.backoff_max_s, policy.backoff_initial_s * 2 ** min(max(attempts, 1) - 1, 62))


def in_flight(row: Row) -> bool:
    return row.status == "pending" and row.started_at > 0


def timed_out(row: Row, policy: MessagingConfig, now: float) -> bool:
    return in_flight(row) and row.started_at + policy.attempt_timeout_s <= now


def deadline_of(row: Row, policy: MessagingConfig) -> float:
    return row.since + policy.delivery_deadline_s


# How often an accepted row's destination is asked whether it processed the message: soon after the
# receipt, then less and less often, at most every backoff_max_s (no event is written per look).
def settlement_check_at(row: Row, policy: MessagingConfig, now: float) -> float:
    waited = max(0.0, now - row.accepted_at)
    step = max(policy.backoff_initial_s, 0.001)
    while step <= waited and step < policy.backoff_max_s:
        step *= 2
    if step >= policy.backoff_max_s:
        step = max(policy.backoff_max_s, 0.001)
        return row.accepted_at + (int(waited // step) + 1) * step
    return row.accepted_at + step


def next_time(row: Row, policy: MessagingConfig, now: float) -> float | None:
    """When a driver must next look at this row; None for a parked one (only a retry moves it)."""
    match row.status:
        case "parked":
            return None
        case "accepted":
            return settlement_check_at(row, policy, now)
    if in_flight(row):
        return row.started_at + policy.attempt_timeout_s
    return min(max(row.retry_at, now), deadline_of(row, policy))


def next_check(rows: dict[str, Row], policy: MessagingConfig, now: float) -> float | None:
    times = [t for row in rows.values() if (t := next_time(row, policy, now)) is not None]
    return min(times) if times else None


@dataclass(frozen=True)
class Step:
    """What a driver does next for a row: ``park`` it (with the reason), ``attempt`` (number ``attempt``), or
    ``fail`` the attempt in flight that timed out; ``settle``: ask the destination whether it processed it."""

    action: str
    attempt: int = 0
    reason: str = ""


def next_step(row: Row, policy: MessagingConfig, now: float) -> Step | None:
    """None: nothing to do now (parked, backing off, an attempt in flight within its timeout)."""
    if row.status == "accepted":
        # Looked at whenever the source is due: asking costs a read, never an event.
        return Step("settle")
    if row.status != "pending":
        return None
    if in_flight(row):
        if not timed_out(row, policy, now):
            return None
        return Step("fail", row.attempts, ATTEMPT_TIMEOUT)
    if deadline_of(row, policy) <= now:
        return Step("park", reason=f"deadline: {row.reason}" if row.reason else "deadline")
    if row.attempts >= policy.max_attempts and spends_budget(row.reason):
        return Step("park", reason=f"attempts: {row.reason}" if row.reason else "attempts")
    if row.retry_at > now:
        return None
    return Step("attempt", row.attempts + 1)


def status_of(row: Row, sender_id: str, policy: MessagingConfig, now: float) -> dict:
    """What inspect answers for a delivery not yet accepted: pending (with its attempts) or parked."""
    out = {"message_id": row.message_id, "sender_session_id": sender_id, "recipient_session_id": row.destination,
           "peer": row.peer, "status": row.status,
           "attempts": row.attempts, "reason": row.reason or None}
    if row.code_version:
        out["code_version"] = row.code_version
    if row.status == "pending":
        if row.retry_at > now:
            out["next_attempt_at"] = row.retry_at
            # Typed backpressure, as on a refusal that may pass later: when the next attempt is made.
            out["retry_after_ms"] = int(round((row.retry_at - now) * 1000))
        out["deadline_at"] = deadline_of(row, policy)
    return out
