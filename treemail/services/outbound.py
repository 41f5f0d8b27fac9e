"""The sender's side of an append: which other sessions' streams the same atomic step writes.

A recipient's events that accept or settle agent mail imply records on the
sender's stream (``domain.outbound.source_events``); they are appended as
sources of the recipient's commit plan, under the sender's etag, so a
source's count of unsettled intents is exact however many processes race.
"""

from ..adapters.eventstore import EventStore, Loaded
from ..domain import events as ev
from ..domain.commitplan import Source
from ..domain.outbound import source_events
from ..domain.records import SessionRecord


async def sources_for(store: EventStore, record: SessionRecord, loaded: Loaded, events: list[ev.Event]
                      ) -> tuple[list[Source], dict[str, Loaded]]:
    """The senders' records ``events`` imply, about to be appended to ``record``'s stream after ``loaded``,
    and the states they were read in (the commit checks their etags)."""
    implied = source_events(record.session_id, loaded.state.status, events, loaded.version)
    if not implied:
        return [], {}
    found = await store.directory.many(list(implied))
    # Tree mail never leaves a tree, so its sender shares the recipient's partition and slot. A sender in
    # another partition wrote over a peer route: one atomic step cannot reach its slot, and peer mail is
    # not counted against the per-source capacity (README, "Peer routes").
    senders = {sid: r for sid, r in found.items() if r is not None and r.partition == record.partition}
    states = await store.load_many(list(senders.values())) if senders else {}
    sources = [Source(senders[sid], states[sid].state, states[sid].version, evs)
               for sid, evs in implied.items() if sid in senders]
    return sources, states
