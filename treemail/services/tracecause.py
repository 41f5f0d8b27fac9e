"""Which trace a send continues: the trace of the message that caused it (one trace per causal chain).

A run's send is caused by the last agent message the run consumed (``domain/loops.cause_of``); that
consume's trace context is kept with the cause in the sender's state. Read only when tracing is on: it
costs the send one read of the sender's snapshot.
"""

from ..adapters import tracing
from ..adapters.eventstore import EventStore
from ..domain import loops


async def cause_traceparent(store: EventStore, session_id: str, run_id: str | None) -> str | None:
    """The traceparent a send from ``run_id`` of ``session_id`` continues; None: a new trace (or the
    caller's current one), as for a send with no cause, or with tracing off."""
    if not run_id or not tracing.enabled():
        return None
    record = await store.directory.get(session_id)
    if record is None:
        return None
    return loops.cause_trace((await store.load(record)).state.run_causes, run_id)
