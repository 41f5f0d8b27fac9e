"""The senders a decision reads: the streams the same atomic step writes their records on.

A recipient's events that settle or restore agent mail imply records on the
sender's stream; the decision returns them (``handlers.decide_command``) and
they are appended as sources of the recipient's commit plan, under the
sender's etag, so a source's count of unsettled intents is exact however
many processes race. Here the senders are loaded before the decision.
"""

from collections.abc import Iterable

from ..adapters.eventstore import EventStore, Loaded
from ..domain.outbound import Sender
from ..domain.records import SessionRecord


async def load_senders(store: EventStore, record: SessionRecord, sender_ids: Iterable[str]
                       ) -> tuple[dict[str, Sender | None], dict[str, Loaded]]:
    """Each sender as the decision reads it (None: the step appending to ``record`` cannot write its stream),
    and the states loaded (the commit checks their etags)."""
    sender_ids = sorted(set(sender_ids))
    if not sender_ids:
        return {}, {}
    found = await store.directory.many(sender_ids)
    # Tree mail never leaves a tree, so its sender shares the recipient's partition and slot. Peer mail
    # settles on its sender through a driver (``services.peerdelivery``), never in this step.
    reachable = [r for r in found.values() if r is not None and r.partition == record.partition]
    held = await store.load_many(reachable) if reachable else {}
    senders: dict[str, Sender | None] = dict.fromkeys(sender_ids)
    for sender in reachable:
        loaded = held[sender.session_id]
        senders[sender.session_id] = Sender(sender, loaded.state, loaded.version)
    return senders, held
