"""Settlement notices: what treemail tells a parent when a child's run ends for good, or it is disposed.

The gates, in order: a disposal that follows a run's end already told to
the parent, with no run since, tells nothing more (``already_told``: the
parent knows how the child ended, and one end is one notice); a child never
announced owes no account (nobody ever gave it mail or its task through
treemail, and its host never said it did); a parent that is gone gets
nothing (the child's stream records it); a parent being disposed has the
notice injected; an idle parent gets it as a new turn (queued, woken if need
be); a busy one gets it steered into the running turn. The notice is
treemail's own words, never credited to the child.

It is decided with the finish or the disposal that earns it and written in
the same atomic step: the child's ``SessionSettled`` on its stream, the notice
on its parent's (they share a partition, ``outbound.Sender``). The child's
state remembers what was settled, so a repeated finish or disposal, or one
retried after its host died, writes neither twice.
"""

from dataclasses import dataclass

from .. import events as ev
from .. import notices
from ..commands import Settle, SettleSession
from ..records import SessionRecord
from ..state import SessionState, settlement_key
from .wake import with_wake

SETTLEMENT_PRODUCER = "settlement:treemail"
# The gate recorded when the parent's state could not be read at all: the child's end stands, nobody is told.
UNREADABLE_PARENT = "failed"
# The gate of a disposal right after a run's end whose notice reached the parent: nothing more is told.
ALREADY_TOLD = "already_told"
TOLD = ("injected", "queued", "steered")


def end_already_told(state: SessionState) -> bool:
    """The child's last run ended for good, its parent was given that notice, and nothing ran since: a
    disposal now would tell the parent the same end twice. Every new run's end is told anew, so a child
    woken by mail that finishes again tells its parent again."""
    return (state.current_run is None and state.last_run is not None and state.settled == state.last_run
            and state.settled_notice in TOLD)


@dataclass(frozen=True)
class SettlementGiven:
    """The child and its parent as the decision read them."""

    child: SessionRecord
    child_state: SessionState
    parent_state: SessionState | None
    now: float = 0.0


@dataclass(frozen=True)
class Settlement:
    """``notice``: the gate that decided; ``parent_events``: what to append to the parent (maybe nothing)."""

    notice: str
    parent_events: list[ev.Event]


def parent_notice(child_id: str, child_handle: str | None, child_state: SessionState,
                  parent_state: SessionState | None, stop_reason: str, closing_text: str | None, disposed: bool,
                  notice_id: str, now: float) -> Settlement:
    """The gates, in order, and the notice's events on the parent's stream."""
    if disposed and end_already_told(child_state):
        return Settlement(ALREADY_TOLD, [])
    if not child_state.announced:
        return Settlement("not_announced", [])
    delivery = notices.notice_delivery(parent_state)
    if delivery == "unavailable":
        return Settlement("parent_unavailable", [])
    events: list[ev.Event] = []
    if SETTLEMENT_PRODUCER not in parent_state.producers:
        events.append(ev.ProducerRegistered(at=now, producer_id=SETTLEMENT_PRODUCER, owner="settlement"))
    events.append(
        ev.ProducerMessageAccepted(
            at=now, message_id=notice_id, producer_id=SETTLEMENT_PRODUCER, owner="settlement",
            # The child it is about, under treemail's own owner: a host tells whose end it reports without
            # ever crediting the words to the child (agent mail is the ``agent`` owner alone).
            sender_session_id=child_id,
            body=notices.settlement_text(child_handle or child_id, stop_reason, closing_text, disposed,
                                         session_id=child_id, resumable=child_state.continuable),
            mode="queue" if delivery == "queued" else "steer",
        )
    )
    return Settlement(delivery, with_wake(parent_state, events, now))


def owed(state: SessionState, run_id: str | None, disposed: bool) -> bool:
    """Whether this end is not settled yet: each run's end, and the disposal, is settled once."""
    return state.settled != settlement_key(run_id, disposed)


def settle_with(settle: Settle, child_id: str, child_state: SessionState, senders, run_id: str | None,
                disposed: bool, now: float) -> tuple[ev.SessionSettled, dict[str, list[ev.Event]]]:
    """The child's record of its settlement and the events on its parent's stream, decided together.

    ``senders``: the streams the step can write (``Given.senders``); the parent is absent or None when it
    is gone or unreadable (``parent_unreadable``)."""
    parent = senders.get(settle.parent_session_id) if settle.parent_session_id else None
    if settle.parent_unreadable:
        settlement = Settlement(UNREADABLE_PARENT, [])
    else:
        settlement = parent_notice(child_id, settle.child_handle, child_state, parent.state if parent else None,
                                   settle.stop_reason, settle.closing_text, disposed, settle.notice_id, now)
    written = bool(settlement.parent_events)
    settled = ev.SessionSettled(
        at=now, run_id=run_id, stop_reason=settle.stop_reason, closing_text=settle.closing_text, disposed=disposed,
        notice=settlement.notice, message_id=settle.notice_id if written else None,
    )
    return settled, ({settle.parent_session_id: settlement.parent_events} if written else {})


def decide_settle(command: SettleSession, given: SettlementGiven) -> Settlement:
    """The gates for a child and its parent, as the notice's own decision (the finish and the disposal
    decide the same through ``settle_with``)."""
    return parent_notice(given.child.session_id, given.child.handle, given.child_state, given.parent_state,
                         command.stop_reason, command.closing_text, command.disposed, command.notice_id, given.now)


def settled_event(command: SettleSession, notice: str, message_id: str | None, now: float) -> ev.SessionSettled:
    """The child's own record of how it ended and what its parent was told."""
    return ev.SessionSettled(
        at=now, run_id=command.run_id, stop_reason=command.stop_reason, closing_text=command.closing_text,
        disposed=command.disposed, notice=notice, message_id=message_id,
    )


def settlement_elsewhere(command, given, events: list[ev.Event]) -> dict[str, list[ev.Event]]:
    """The parent's notice, for a finish or a close whose events settle the child (``Handler.elsewhere``):
    decided again on the same inputs, so it is the very notice the child's ``SessionSettled`` names."""
    settle = getattr(command, "settle", None)
    settled = next((e for e in events if isinstance(e, ev.SessionSettled)), None)
    if settle is None or settled is None or settled.message_id is None:
        return {}
    _, elsewhere = settle_with(settle, given.session_id, given.state, given.senders, settled.run_id,
                               settled.disposed, given.now)
    return elsewhere


def settlement_parent(command, _mail=None, _history=()) -> set[str]:
    """The parent whose stream a settling finish or close writes on (``Handler.reads_senders``)."""
    settle = getattr(command, "settle", None)
    if settle is None or settle.parent_session_id is None or settle.parent_unreadable:
        return set()
    return {settle.parent_session_id}
