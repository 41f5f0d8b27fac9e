"""A keyed tool call decided in the host process (a peer send, an interrupt): its one append.

The decision is committed on the target's stream with the tool call's
idempotency record, in the same atomic step and under the same expected etag
as any append. The step answers one of three ways: applied (the decision's
outcome stands), the call was decided already (its first outcome is the
answer, or a conflict if its arguments differ), or another writer came first
(the caller decides again on fresh state).
"""

from ..adapters import metrics
from ..adapters.eventstore import EventStore, Loaded
from ..domain.commitplan import Idempotency, plan_commit
from ..domain.decide.idempotency import Keyed
from ..domain.decide.send import Accepted, Refused, outcome_of
from ..domain.messaging import MessagingConfig
from ..domain.records import SessionRecord


async def append_keyed(
    store: EventStore, keyed: Keyed, arguments, digest: str, target: SessionRecord, loaded: Loaded,
    decision: Accepted | Refused, *, policy: MessagingConfig | None = None, now: float = 0.0,
    read_draining: bool | None = None,
) -> dict | None:
    """The outcome the model is answered, durable; None when another writer appended first (decide again).

    ``policy`` keeps the partition's due index at ``now``; ``read_draining``: the service-wide drain flag
    as the decision read it (None: it did not look)."""
    outcome = outcome_of(decision)
    events = decision.events if isinstance(decision, Accepted) else []
    plan = plan_commit(
        target, loaded.state, loaded.version, events, policy=policy, now=now, read_draining=read_draining,
        idempotency=Idempotency(target.session_id, digest, keyed.record(arguments, outcome)),
    )
    result = await store.append(store.prepare(plan, loaded))
    if result.status == "ok":
        return outcome
    if result.status == "dup":
        return keyed.replayed_outcome(result.record, arguments)
    metrics.CONFLICT_ROUNDS.inc()
    return None
