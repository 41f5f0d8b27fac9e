"""Delivery policy (mail as an obligation): when a message is deliverable, how long a failed attempt waits, and when
the pump must next look at a session. Pure: every function takes the clock as ``now``.
"""

from collections.abc import Iterable

from ..leasedruns import leased
from ..messaging import MessagingConfig
from ..state import MailItem, SessionState
from . import ordering, steer, stranded

# Pending, not claimed, not parked: a run may take it once its backoff is over.
WAITING = ("accepted", "admitted", "released")


def asleep(state: SessionState) -> bool:
    """Idle or finished with no run open: only a new run (a wake) will ever deliver its mail."""
    return state.status in ("idle", "finished") and state.current_run is None


def wakeable(state: SessionState) -> bool:
    """Asleep, and a wake may start a run: never a session that is not continuable or is being disposed
    (disposal cutoff), whose mail waits for its disposal to return it, nor one whose run was just aborted:
    the abort itself wakes nobody, its mail waits for the next message to wake it."""
    return asleep(state) and state.continuable and state.disposal is None and not state.abort_hold


def deliverable(item: MailItem, now: float) -> bool:
    return item.state in WAITING and item.retry_at <= now


def backoff_delay(policy: MessagingConfig, attempts: int) -> float:
    """Exponential from ``backoff_initial_s`` after the first failed attempt, capped at ``backoff_max_s``."""
    if attempts <= 0:
        return 0.0
    return min(policy.backoff_max_s, policy.backoff_initial_s * 2 ** min(attempts - 1, 62))


def deadline_of(item: MailItem, policy: MessagingConfig) -> float | None:
    """When an unprocessed message parks; None for an item stored before the budget was recorded."""
    return item.since + policy.delivery_deadline_s if item.since > 0 else None


def claim_expires_at(item: MailItem, policy: MessagingConfig) -> float:
    return item.claimed_at + (policy.mcp_lease_s if leased(item.run_id) else policy.attempt_timeout_s)


# A leased run records that its agent called only when its last record is older than this fraction of
# ``mcp_idle_s`` (one small event a minute at the default, however often the agent calls): so the run ends
# between 0.9 and 1.0 of ``mcp_idle_s`` after the agent's last call.
RENEW_AT = 0.1


def idle_at(state: SessionState, policy: MessagingConfig) -> float | None:
    """When the session's leased run has gone ``mcp_idle_s`` with no call recorded; None for any other run."""
    return state.run_seen_at + policy.mcp_idle_s if leased(state.current_run) else None


def renewal_due(state: SessionState, policy: MessagingConfig, now: float) -> bool:
    """A call of the leased run's agent should be recorded (``SessionRunRenewed``)."""
    return leased(state.current_run) and now - state.run_seen_at >= RENEW_AT * policy.mcp_idle_s


def wake_stale(state: SessionState, policy: MessagingConfig, now: float, stale_before: float = 0.0) -> bool:
    """An outstanding wake nobody acted on within an attempt timeout (or before ``stale_before``) may be lost."""
    requested = state.wake_requested_at
    return requested < stale_before or requested + policy.attempt_timeout_s <= now


def expiry_time(item: MailItem) -> list[float]:
    """Expiry: when the pump settles an undelivered message that expires (a parked one too)."""
    return [item.expires_at] if item.expires_at > 0 and item.state != "claimed" else []


def check_times(state: SessionState, item: MailItem, policy: MessagingConfig, now: float) -> list[float]:
    """When the pump must look at this item: its claim's expiry, else its deadline, and for an asleep
    session the end of a backoff still running (a running session's next claim takes it without
    help; once over, the item is due and the session-wide wake check below covers it)."""
    if stranded.unreported(state, item):
        return [now]  # reported at the pump's next pass
    if item.state == "claimed":
        return [claim_expires_at(item, policy)]
    if item.state not in WAITING:
        return expiry_time(item)
    times = [t for t in (deadline_of(item, policy),) if t is not None] + expiry_time(item)
    times += steer.check_time(state, item, policy)  # flow control: the steer deadline
    if wakeable(state) and item.retry_at > now:
        times.append(item.retry_at)
    return times


def next_check(
    state: SessionState, items: Iterable[MailItem], policy: MessagingConfig, now: float
) -> float | None:
    """The earliest time the pump must act on this session, over ``items``; None if never.

    Given every pending item the answer is exact; given only the items one
    append changed it is a bound that the index keeps with ``ZADD LT``.
    """
    items = list(items)
    times: list[float] = []
    for item in items:
        times.extend(check_times(state, item, policy, now))
    # A leased run whose agent stopped calling is finished by the pump.
    times += [t for t in (idle_at(state, policy),) if t is not None]
    # Order: mail held behind an earlier message of its pair is not due (that one's backoff end is checked).
    due_now = ordering.any_due(items, now, WAITING)
    if wakeable(state) and state.pending_all > 0:
        wake_expires = state.wake_requested_at + policy.attempt_timeout_s
        if state.wake_pending and wake_expires > now:
            times.append(wake_expires)
        elif due_now:
            # No wake outstanding (or it looks lost) and mail is due: act now.
            times.append(now)
    return min(times) if times else None
