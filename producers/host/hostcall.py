"""A host's own call (not a model's tool call) as a send context, shared by every host method that sends."""

from treemail.adapters.eventstore import EventStore
from treemail.domain import ids, limits
from treemail.domain.commands import SendContext


async def host_context(store: EventStore, session_id: str, idempotency_key: str | None,
                       run_id: str | None) -> SendContext:
    """The host's idempotency key as the tool call id (``key:<key>``, within its limit; no key: a new call each
    time), from ``run_id`` or else the session's open run (exact live sender: with none open, the decision
    answers ``sender_not_live``)."""
    limits.require_text("idempotency_key", idempotency_key, limits.MAX_IDEMPOTENCY_KEY_BYTES, optional=True)
    call = f"key:{idempotency_key}" if idempotency_key is not None else f"host:{ids.uuid7()}"
    if run_id is None:
        record = await store.directory.get(session_id)
        run_id = (await store.load(record)).state.current_run if record is not None else None
    return SendContext(session_id, run_id or "", call)
