"""Wake: the one place that decides whether a session needs a host runner to start a run."""

from .. import events as ev
from ..state import SessionState, fold


def has_mail_due_while_asleep(state: SessionState) -> bool:
    """Idle or finished, no run open, and mail pending: only a new run will ever deliver it.

    Never for a session that is not continuable or is being disposed (seed 002).
    """
    return (
        state.status in ("idle", "finished") and state.current_run is None and state.pending_all > 0
        and state.continuable and state.disposal is None
    )


def with_wake(state: SessionState, events: list[ev.Event], now: float = 0.0) -> list[ev.Event]:
    """Add a wake request when these events leave the session asleep with mail due.

    At most one wake is outstanding per session: more mail before the woken
    run starts rides on the same wake.
    """
    after = fold(events, state)
    if has_mail_due_while_asleep(after) and not after.wake_pending:
        reason = next((e.message_id for e in reversed(events) if isinstance(e, ev.ProducerMessageAccepted)), None)
        return [*events, ev.SessionWakeRequested(at=now, message_id=reason)]
    return events


def decide_reconcile_wake(state: SessionState, now: float = 0.0) -> list[ev.Event]:
    """After a restart: ask again, even if a wake was already requested, since its trigger may be lost.

    A duplicate trigger is harmless: a runner that finds the session already
    running only acknowledges it.
    """
    if has_mail_due_while_asleep(state):
        return [ev.SessionWakeRequested(at=now)]
    return []
