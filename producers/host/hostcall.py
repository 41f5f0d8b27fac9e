"""A host's own call (not a model's tool call) as a send context, shared by every host method that sends."""

from treemail.domain import ids, limits
from treemail.domain.commands import SendContext
from treemail.services.sessionreader import SessionReader


def require_context(context) -> SendContext:
    """The context of a model's call as the host hands it over: a ``SendContext``, refused (``identifier:invalid``)
    as anything else before anything reads it (it was an AttributeError deep in the call)."""
    if not isinstance(context, SendContext):
        raise limits.invalid(f"context must be a SendContext(session_id, run_id, tool_call_id), got "
                             f"{type(context).__name__}")
    return context


async def host_context(reader: SessionReader, session_id: str, idempotency_key: str | None,
                       run_id: str | None) -> SendContext:
    """The host's idempotency key as the tool call id (``key:<key>``, within its limit; no key: a new call each
    time), from ``run_id`` or else the session's open run (exact live sender: with none open, the decision
    answers ``sender_not_live``)."""
    limits.require_text("idempotency_key", idempotency_key, limits.MAX_IDEMPOTENCY_KEY_BYTES, optional=True)
    call = f"key:{idempotency_key}" if idempotency_key is not None else f"host:{ids.uuid7()}"
    if run_id is None:
        run_id = await reader.current_run(session_id)
    return SendContext(session_id, run_id or "", call)
