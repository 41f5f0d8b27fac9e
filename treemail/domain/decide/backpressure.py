"""Typed backpressure: a send refused for a reason that may pass later says when to retry, and why.

Explained on the same states the guards refused on (the decision's own
given), so the answer is as exact as the refusal and is recorded with it: a
retried tool call is answered with the same wait and occupancy, whatever
changed since. The default text stays as it is; the wait and the occupancy
are appended to it, and carried as fields of the structured error.
"""

from .. import flow
from ..errors import Code, Rejected
from ..messaging import MessagingConfig
from ..state import SessionState
from .guards import Found

MAY_PASS = frozenset({Code.INBOX_FULL, Code.INFLIGHT_FULL, Code.SOURCE_CAPACITY, Code.PEER_OUTBOX_FULL,
                      Code.DRAINING})


def explain(rejection: Rejected, given) -> tuple[str, dict | None]:
    """The refusal's message for the model and its backpressure fields (None for a refusal that will not
    pass by waiting). ``given``: the send's (or the peer send's) ``SendGiven``."""
    if rejection.code not in MAY_PASS:
        return rejection.message, None
    sender_id = given.sender.session_id if given.sender is not None else ""
    recipient = given.target.state if isinstance(given.target, Found) else None
    retry_ms, occupancy, text = _pressure(rejection.code, sender_id, given.sender_state, recipient, given.config,
                                          given.service_draining)
    return flow.appended(rejection.message, retry_ms, text), flow.backpressure(retry_ms, occupancy)


def _pressure(code: Code, sender_id: str, sender: SessionState, recipient: SessionState | None,
              config: MessagingConfig, service_draining: bool) -> tuple[int, dict, str]:
    """(retry after, occupancy, its words): the slots that must free up, times the pace they were seen to free at."""
    recipient = recipient or SessionState()
    match code:
        case Code.INBOX_FULL:
            pending, limit = recipient.pending_agent, config.max_pending_per_session
            wait = flow.retry_after_ms(recipient.consumed_pace, pending - limit + 1, config)
            return wait, {"pending": pending, "limit": limit}, f"{pending} of {limit} pending"
        case Code.INFLIGHT_FULL:
            # The pair's oldest message may wait behind every other sender's pending mail: the recipient
            # consumes in arrival order, so the wait counts them all (a slight overestimate at worst).
            in_flight, window = recipient.pair_inflight.get(sender_id, 0), config.max_inflight_per_pair
            ahead = max(0, recipient.pending_agent - in_flight)
            wait = flow.retry_after_ms(recipient.consumed_pace, ahead + 1, config)
            return wait, {"in_flight": in_flight, "window": window}, f"{in_flight} of {window} in flight to this recipient"
        case Code.SOURCE_CAPACITY:
            outstanding, limit = sender.outstanding, config.max_outstanding_per_source
            wait = flow.retry_after_ms(sender.settled_pace, outstanding - limit + 1, config)
            return wait, {"unsettled": outstanding, "limit": limit}, f"{outstanding} of {limit} unsettled"
        case Code.PEER_OUTBOX_FULL:
            rows = sender.outbox.values()
            retained = sum(row.status == "accepted" for row in rows)
            waiting = len(sender.outbox) - retained
            if waiting >= config.max_pending_peer_deliveries:
                held, limit, words = waiting, config.max_pending_peer_deliveries, "waiting to be delivered"
            else:
                held, limit, words = retained, config.max_retained_peer_deliveries, "unprocessed"
            wait = flow.retry_after_ms(sender.settled_pace, held - limit + 1, config)
            return wait, {"pending": held, "limit": limit}, f"{held} of {limit} {words}"
    return _draining(sender, recipient, config, service_draining)


def _draining(sender: SessionState, recipient: SessionState, config: MessagingConfig,
              service_draining: bool) -> tuple[int, dict, str]:
    """A drain ends once what it holds is settled: its pending mail, at the pace it was seen to drain.
    The service's own drain is paced by nothing a session shows: the upper bound."""
    if service_draining:
        return config.retry_after_max_ms, {"draining": "service"}, "the service is draining"
    if sender.drained_by:
        held, pace, who = sender.outstanding, sender.settled_pace, "sender"
    else:
        held, pace, who = recipient.pending_agent, recipient.consumed_pace, "recipient"
    wait = flow.retry_after_ms(pace, held, config)
    return wait, {"draining": who, "pending": held}, f"draining, {held} pending"
