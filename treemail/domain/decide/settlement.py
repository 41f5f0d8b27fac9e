"""Settlement notices: what treemail tells a parent when a child's run ends for good.

The gates, in order: a child never sent a message owes no account (not
announced); a parent that is gone gets nothing (the child's stream records
it); a parent being disposed has the notice injected; an idle parent gets it
as a new turn (queued, woken if need be); a busy one gets it steered into the
running turn. The notice is treemail's own words, never credited to the child.
"""

from dataclasses import dataclass

from .. import events as ev
from .. import notices
from ..commands import SettleSession
from ..records import SessionRecord
from ..state import SessionState
from .wake import with_wake

SETTLEMENT_PRODUCER = "settlement:treemail"


@dataclass(frozen=True)
class SettlementGiven:
    """The child and its parent, loaded together in one round trip."""

    child: SessionRecord
    child_state: SessionState
    parent_state: SessionState | None
    now: float = 0.0


@dataclass(frozen=True)
class Settlement:
    """``notice``: the gate that decided; ``parent_events``: what to append to the parent (maybe nothing)."""

    notice: str
    parent_events: list[ev.Event]


def decide_settle(command: SettleSession, given: SettlementGiven) -> Settlement:
    if not given.child_state.announced:
        return Settlement("not_announced", [])
    delivery = notices.notice_delivery(given.parent_state)
    if delivery == "unavailable":
        return Settlement("parent_unavailable", [])
    parent = given.parent_state
    events: list[ev.Event] = []
    if SETTLEMENT_PRODUCER not in parent.producers:
        events.append(ev.ProducerRegistered(at=given.now, producer_id=SETTLEMENT_PRODUCER, owner="settlement"))
    events.append(
        ev.ProducerMessageAccepted(
            at=given.now, message_id=command.notice_id, producer_id=SETTLEMENT_PRODUCER, owner="settlement",
            body=notices.settlement_text(
                given.child.handle, command.stop_reason, command.closing_text, command.disposed
            ),
            mode="queue" if delivery == "queued" else "steer",
        )
    )
    return Settlement(delivery, with_wake(parent, events, given.now))


def settled_event(command: SettleSession, notice: str, message_id: str | None, now: float) -> ev.SessionSettled:
    """The child's own record of how it ended and what its parent was told."""
    return ev.SessionSettled(
        at=now, run_id=command.run_id, stop_reason=command.stop_reason, closing_text=command.closing_text,
        disposed=command.disposed, notice=notice, message_id=message_id,
    )
