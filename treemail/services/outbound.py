"""The sender's side of an append (seed 004): which other sessions' streams the same atomic step writes.

A recipient's events that accept or settle agent mail imply records on the
sender's stream (``domain.outbound.source_events``); they are appended as
companions of the recipient's append, under the sender's etag, so a source's
count of unsettled intents is exact however many processes race.
"""

from ..adapters.eventstore import Companion, EventStore, Loaded
from ..domain import events as ev
from ..domain.outbound import source_events
from ..domain.records import SessionRecord


async def companions_for(store: EventStore, record: SessionRecord, loaded: Loaded, events: list[ev.Event],
                         senders_loaded: dict[str, Loaded] | None = None) -> list[Companion]:
    """Companions for ``events`` about to be appended to ``record``'s stream after ``loaded``.

    ``senders_loaded``: states the caller already holds (a batch chaining its
    appends); others are read now.
    """
    implied = source_events(record.session_id, loaded.state.status, events, loaded.version)
    if not implied:
        return []
    found = await store.directory.many(list(implied))
    # Tree mail never leaves a tree, so its sender shares the recipient's partition and slot. A sender in
    # another partition wrote over a peer route: one atomic step cannot reach its slot, and peer mail is
    # not counted against the per-source capacity (README, "Peer routes").
    senders = {sid: r for sid, r in found.items() if r is not None and r.partition == record.partition}
    held = senders_loaded or {}
    missing = [r for r in senders.values() if r.session_id not in held]
    states = {**(await store.load_many(missing) if missing else {}), **held}
    return [Companion(senders[sid], states[sid], evs) for sid, evs in implied.items() if sid in senders]
