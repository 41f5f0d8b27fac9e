"""The steer deadline: steer mail its running recipient does not take in time falls back to queue. Pure.

Steer mail joins a running recipient's run at its next step boundary. A run
that reaches no boundary (a long tool call, a provider stuck in one request)
would hold it for as long as the run lasts; a host that hands it back at
every boundary would hold it forever. So a steer message waiting on a run
falls back to queue, delivered at the recipient's next run start like queued
mail, when

- ``steer_deadline_s`` passed since its acceptance (the pump acts on it: the
  session's due time includes the deadline, and ``KeepObligations`` decides it),
- ``steer_max_boundaries`` step boundaries handed it back (decided with the release), or
- the run it waited on ended before any boundary took it (decided with the finish).

Each fallback is a ``ProducerMessageSteerFellBack`` on the recipient's stream,
so the message's history and ``inspect`` (reason ``steer_<why>``) show it, and
the next run receives it as queued mail the sender can see was queued: nothing
is carried silently from one run into another.
"""

from .. import events as ev
from ..frozen import replace
from ..messaging import MessagingConfig
from ..state import NEXT_INCARNATION, MailItem, SessionState

DEADLINE = "deadline"
BOUNDARIES = "boundaries"
RUN_FINISHED = "run_finished"


def waiting_on_run(item: MailItem, state: SessionState) -> bool:
    """Steer mail pending on the open run's next boundary: accepted while it ran (mail pending when a run
    starts is admitted into it instead), or handed back at one of its boundaries. Never past the disposal
    cutoff: that mail goes back to its senders, or waits for the next incarnation, whatever its mode."""
    if not _steer_on_open_session(item, state) or state.current_run is None:
        return False
    return item.state == "accepted" or (item.state == "released" and item.run_id == state.current_run)


def deadline_at(item: MailItem, policy: MessagingConfig) -> float | None:
    if policy.steer_deadline_s <= 0 or item.since <= 0:
        return None
    return item.since + policy.steer_deadline_s


def check_time(state: SessionState, item: MailItem, policy: MessagingConfig) -> list[float]:
    """When the pump must look at this item for its steer deadline (the due index keeps the earliest)."""
    at = deadline_at(item, policy) if waiting_on_run(item, state) else None
    return [] if at is None else [at]


def fell_back(item: MailItem, run_id: str | None, reason: str, now: float) -> ev.ProducerMessageSteerFellBack:
    return ev.ProducerMessageSteerFellBack(
        at=now, message_id=item.message_id, owner=item.owner, sender_session_id=item.sender_session_id,
        agent_hop=item.agent_hop, run_id=run_id, reason=reason,
        waited_s=max(0.0, now - item.since) if item.since > 0 else 0.0, boundaries=item.passed,
    )


def past_deadline(state: SessionState, items, policy: MessagingConfig, now: float,
                  acted: frozenset[str] = frozenset()) -> list[ev.Event]:
    """The pump's rule: steer mail waiting on the open run past its deadline (``acted``: items another rule
    of the same decision already moved)."""
    out: list[ev.Event] = []
    for item in items:
        at = deadline_at(item, policy)
        if item.message_id not in acted and waiting_on_run(item, state) and at is not None and at <= now:
            out.append(fell_back(item, state.current_run, DEADLINE, now))
    return out


def at_release(item: MailItem, policy: MessagingConfig, run_id: str | None, now: float) -> list[ev.Event]:
    """Handed back at a step boundary: the boundary that reaches ``steer_max_boundaries`` queues it."""
    limit = policy.steer_max_boundaries
    if item.mode != "steer" or limit <= 0 or item.passed + 1 < limit:
        return []
    return [fell_back(replace(item, passed=item.passed + 1), run_id, BOUNDARIES, now)]


def at_finish(items, state: SessionState, run_id: str, now: float) -> list[ev.Event]:
    """The run ends: steer mail accepted while it ran and never taken by a boundary is queued, on the record,
    for the next run start (mail a boundary took and did not consume is the obligation rules' failed attempt)."""
    return [fell_back(item, run_id, RUN_FINISHED, now) for item in items
            if item.state == "accepted" and _steer_on_open_session(item, state)]


def _steer_on_open_session(item: MailItem, state: SessionState) -> bool:
    return item.mode == "steer" and state.disposal is None and item.reason != NEXT_INCARNATION
