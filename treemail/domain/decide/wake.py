"""Wake: the one place that decides whether a session needs a host runner to start a run."""

from collections.abc import Mapping

from .. import events as ev
from ..state import MailItem, SessionState, evolve, evolve_mail, fold
from . import ordering
from .delivery import WAITING, wakeable


def has_mail_due_while_asleep(state: SessionState, mail: Mapping[str, MailItem] | None = None,
                              now: float = 0.0) -> bool:
    """Idle or finished, no run open, and mail pending: only a new run will ever deliver it.

    Given the session's mail (mail as an obligation), only mail deliverable at ``now``
    counts: parked mail and mail still in its backoff need no run yet (the
    pump wakes the session when the backoff ends), so a run that ends with
    only such mail is not woken again at once, and again, and again.
    Never for a session that is not continuable or is being disposed (disposal cutoff).
    """
    if not (wakeable(state) and state.pending_all > 0):
        return False
    return mail is None or ordering.any_due(mail.values(), now, WAITING)


def mail_after(mail: Mapping[str, MailItem], events: list[ev.Event]) -> dict[str, MailItem]:
    after = dict(mail)
    for event in events:
        evolve_mail(after, event, 0)
    return after


def with_wake(state: SessionState, events: list[ev.Event], now: float = 0.0,
              mail: Mapping[str, MailItem] | None = None) -> list[ev.Event]:
    """Add a wake request when these events leave the session asleep with mail due.

    At most one wake is outstanding per session: more mail before the woken
    run starts rides on the same wake.
    """
    return with_wake_folded(state, events, now, mail)[0]


def with_wake_folded(state: SessionState, events: list[ev.Event], now: float = 0.0,
                     mail: Mapping[str, MailItem] | None = None) -> tuple[list[ev.Event], SessionState]:
    """``with_wake``, and the state all the events leave: folded here once, so the append need not
    fold them again (``state.apply``'s ``folded``)."""
    after = fold(events, state)
    due = has_mail_due_while_asleep(after, None if mail is None else mail_after(mail, events), now)
    if due and not after.wake_pending:
        reason = next((e.message_id for e in reversed(events) if isinstance(e, ev.ProducerMessageAccepted)), None)
        wake = ev.SessionWakeRequested(at=now, message_id=reason)
        return [*events, wake], evolve(after, wake)
    return events, after


def decide_reconcile_wake(state: SessionState, now: float = 0.0) -> list[ev.Event]:
    """After a restart: ask again, even if a wake was already requested, since its trigger may be lost.

    A duplicate trigger is harmless: a runner that finds the session already
    running only acknowledges it.
    """
    if has_mail_due_while_asleep(state):
        return [ev.SessionWakeRequested(at=now)]
    return []
