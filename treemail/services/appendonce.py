"""Appending a notice exactly once on another session's stream (disposal and settlement notices).

Disposal and settlement write on a second session (a sender, a parent) after
deciding on the first; either may be repeated after a crash. The write is
keyed like a tool call: the commit script stores ``record`` under ``digest``
in the same atomic step and answers a repeat with it, so a notice is never
written twice. A conflict (the session changed meanwhile) decides again.
"""

from collections.abc import Callable

from ..adapters.eventstore import EventStore, Loaded
from ..domain import digests
from ..domain import events as ev
from ..domain.commitplan import Idempotency, plan_commit
from ..domain.messaging import MessagingConfig
from ..domain.records import SessionRecord
from ..domain.state import SessionState
from .clock import Clock
from .transaction import Write, transact


def notice_digest(*parts: str | None) -> str:
    return digests.digest(["notice", *parts])


async def append_once(
    store: EventStore, clock: Clock, record: SessionRecord,
    decide: Callable[[SessionState, float], tuple[list[ev.Event], dict]],
    digest: str, policy: MessagingConfig, first: Loaded | None = None,
) -> dict | None:
    """Decide on fresh state (``first``, if the caller loaded it already) and append under ``digest``.

    ``decide`` is given the state and the time and returns the events and what to record. Returns the
    record (of this append, or of the one before it), or None when there was nothing to append.
    ``policy`` keeps the partition's due index (mail as an obligation): a notice is mail like any
    other, with attempts, backoff and a deadline.
    """
    async def round_(attempt: int) -> Write:
        loaded = first if first is not None and not attempt else await store.load(record)
        now = clock.now()
        events, value = decide(loaded.state, now)
        if not events:
            return Write(None)
        plan = plan_commit(record, loaded.state, loaded.version, events, policy=policy, now=now,
                           idempotency=Idempotency(record.session_id, digest, value))
        return Write(value, plan, loaded)

    return await transact(store, record.session_id, round_, replayed=_as_kept)


def _as_kept(kept):
    """A notice appended before: what its first append recorded is the answer."""
    return kept


async def append_fixed(store: EventStore, record: SessionRecord, events: list[ev.Event]) -> None:
    """Append events already decided (a record of what happened elsewhere), whatever was appended since."""
    async def round_(_attempt: int) -> Write:
        loaded = await store.load(record)
        return Write(None, plan_commit(record, loaded.state, loaded.version, events), loaded)

    await transact(store, record.session_id, round_)
