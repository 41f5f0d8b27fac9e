"""Delivery as an obligation: failed attempts, parking, what the pump does, explicit retry.

Every decision here is a pure function of the session's state, its pending
mail, the policy and the clock, so two pumps deciding on the same state
append the same events once: the second one's etag check fails, it decides
again on the newer state and finds nothing left to do.
"""

from .. import events as ev
from ..commands import KeepObligations, RetryMail
from ..errors import LifecycleError
from ..messaging import MessagingConfig
from ..state import MailItem, fold
from . import mailcontrol, ordering, steer, stranded
from .delivery import WAITING, backoff_delay, claim_expires_at, deadline_of, wake_stale, wakeable
from .wake import mail_after, with_wake

# Bounded reasons: what inspect shows. Diagnostics never leave storage as raw text.
RELEASED = "released"
ATTEMPT_TIMEOUT = "attempt_timeout"
RUN_FINISHED = "run_finished"
# A woken run (or any run the message was due in) ended without claiming it: a failed delivery attempt.
WAKE_UNCLAIMED = "wake_unclaimed"
MAX_ATTEMPTS = "max_attempts"
DEADLINE = "deadline"


def step_event(cls, item: MailItem, run_id: str | None, now: float, **extra) -> ev.MessageEvent:
    return cls(
        at=now, message_id=item.message_id, owner=item.owner, sender_session_id=item.sender_session_id,
        agent_hop=item.agent_hop, run_id=run_id, **extra,
    )


def past_deadline(item: MailItem, policy: MessagingConfig, now: float) -> bool:
    deadline = deadline_of(item, policy)
    return deadline is not None and deadline <= now


def fail_attempt(item: MailItem, reason: str, policy: MessagingConfig, now: float,
                 counted: bool = True, backoff: bool = True, detail: str = "") -> ev.MessageEvent:
    """An attempt that did not end in consumption: released with a backoff, or parked once the budget is spent.

    ``counted``: a claim already counted the attempt; otherwise (a run that ended without claiming the
    message) the release counts it, so a provider that never claims spends the budget as surely as one
    that claims and fails. ``backoff=False``: the run was cut short by its host's restart, not failed by
    its mail; the attempt counts and the message is due at once.
    """
    attempts = item.attempts if counted else item.attempts + 1
    if attempts >= policy.max_attempts:
        return step_event(ev.ProducerMessageParked, item, item.run_id, now, reason=MAX_ATTEMPTS)
    if past_deadline(item, policy, now):
        return step_event(ev.ProducerMessageParked, item, item.run_id, now, reason=DEADLINE)
    return step_event(ev.ProducerMessageReleased, item, item.run_id, now, reason=reason,
                      retry_at=now + backoff_delay(policy, attempts) if backoff else 0.0,
                      attempts_change=0 if counted else 1, detail=detail)


def release_at_boundary(item: MailItem, now: float, detail: str = "") -> ev.MessageEvent:
    """The host hands a claimed message back at a step boundary: not a failure. Due at the next boundary,
    no backoff, and the claim's attempt is given back; ``detail`` is the host's own reason, if it gave one."""
    return step_event(ev.ProducerMessageReleased, item, item.run_id, now, reason=RELEASED,
                      attempts_change=-1 if item.attempts > 0 else 0, detail=detail)


def unclaimed_at_finish(item: MailItem, run_id: str, now: float) -> bool:
    """Due in the run that just ended and never claimed in it: the run was an attempt that failed.

    Admitted to the run as its input, or released in it and not taken again; mail still backing off
    was not due, and mail that arrived for a later turn was never the run's to take.
    """
    return item.run_id == run_id and item.state in ("admitted", "released") and item.retry_at <= now


def decide_keep(command: KeepObligations, given) -> list[ev.Event]:
    """What the session's mail is owed now: expired claims failed, passed deadlines parked, a wake if needed."""
    policy, now = given.config, given.now
    # Expiry: an undelivered message past its expiry is settled as expired before anything else is owed it.
    events: list[ev.Event] = mailcontrol.expired_events(given.mail, now)
    gone = {e.message_id for e in events}
    for item in sorted(given.mail.values(), key=lambda m: m.seq):
        if item.message_id in gone:
            continue
        if item.state == "claimed" and claim_expires_at(item, policy) <= now:
            events.append(fail_attempt(item, ATTEMPT_TIMEOUT, policy, now))
        elif item.state in WAITING and past_deadline(item, policy, now):
            # A claimed message past its deadline is left to its attempt: parked when that fails.
            events.append(step_event(ev.ProducerMessageParked, item, item.run_id, now, reason=DEADLINE))
    # Flow control: steer mail the open run did not take by its deadline falls back to queue.
    acted = frozenset(e.message_id for e in events)
    events += steer.past_deadline(given.state, sorted(given.mail.values(), key=lambda m: m.seq), policy, now, acted)
    # Mail no rule can end any more is reported, once, instead of waiting for ever.
    events += stranded.stranded_events(given.state, [m for m in sorted(given.mail.values(), key=lambda m: m.seq)
                                                     if m.message_id not in gone], now)
    state = fold(events, given.state)
    mail = mail_after(given.mail, events)
    needs_wake = wakeable(state) and ordering.any_due(mail.values(), now, WAITING)
    if needs_wake and (not state.wake_pending or wake_stale(state, policy, now, command.stale_before)):
        events.append(ev.SessionWakeRequested(at=now))
    return events


def require_parked(mail, message_id: str) -> MailItem:
    item = mail.get(message_id)
    if item is None:
        raise LifecycleError("lifecycle:unknown_message", f"message {message_id} is not pending on this session")
    if item.state != "parked":
        raise LifecycleError("retry_message:not_parked", f"message {message_id} is {item.state}, not parked")
    return item


def decide_retry(command: RetryMail, given) -> list[ev.Event]:
    """A parked message gets a new budget (attempts and deadline from now) and is due at once."""
    item = require_parked(given.mail, command.message_id)
    events: list[ev.Event] = [step_event(ev.ProducerMessageRetried, item, None, given.now)]
    return with_wake(given.state, events, given.now, given.mail)
