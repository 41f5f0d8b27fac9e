"""Whole subtrees: the recorded steps of a broadcast and of a cascading stop.

Each is recorded once (``append_once``, under a digest of its key) on the
stream it starts from, before anything is sent or stopped, so calling again
with the same key resumes it with what was recorded (the same broadcast id and
recipients, the same order): a crash anywhere in the middle never sends a copy
twice, never stops a session out of order, and never widens the set. The
copies themselves are sent by the caller through the ordinary send path.
"""

from dataclasses import dataclass

from ..adapters.eventstore import EventStore
from ..domain import ids
from ..domain.commands import BroadcastToSubtree, InterruptRun, RecordBroadcastDelivery, SealSession, StopSubtree
from ..domain.decide import subtree
from ..domain.decide.lifecycle import Given
from ..domain.errors import Code, Rejected
from ..domain.handlers import HANDLERS
from ..domain.records import SessionRecord
from .appendonce import append_once, notice_digest
from .clock import SYSTEM_CLOCK, Clock
from .disposal import DisposalService
from .sessions import SessionService


@dataclass(frozen=True)
class Broadcast:
    broadcast_id: str
    run_id: str
    body: str
    mode: str
    # Top-down, fixed when the broadcast was first recorded.
    recipients: tuple[str, ...]


class SubtreeService:
    def __init__(self, store: EventStore, sessions: SessionService, disposal: DisposalService,
                 clock: Clock = SYSTEM_CLOCK) -> None:
        self.store = store
        self.sessions = sessions
        self.disposal = disposal
        self.clock = clock

    async def tree(self, top: SessionRecord) -> list[SessionRecord]:
        """Every session of ``top``'s tree the tree index knows now (one slot: the tree's partition)."""
        members = await self.store.directory.tree_members(top.partition, top.root_session_id)
        return [r for r in (await self.store.directory.many(members)).values() if r is not None]

    async def _append(self, record: SessionRecord, command, digest: str, value: dict) -> dict | None:
        decide = HANDLERS[type(command)].decide
        policy = self.sessions.config.messaging

        def decided(state, now):
            return decide(command, Given(state, {}, policy, now, session_id=record.session_id)), value

        return await append_once(self.store, self.clock, record, decided, digest, policy)

    async def start_broadcast(self, sender: SessionRecord, run_id: str, call: str, body: str, mode: str) -> Broadcast:
        """The broadcast this (sender, run, call) records: the first one's, or a new one for the descendants
        known now. The same key with another body or mode is a conflict; a sender whose open run is not
        ``run_id`` is refused (``Rejected``), nothing recorded."""
        digest = subtree.broadcast_digest(sender.session_id, run_id, call)
        fingerprint = subtree.broadcast_fingerprint(body, mode)
        recorded = await self.store.recorded(sender, digest)
        if recorded is None:
            recipients = tuple(r.session_id for r in subtree.descendants(sender, await self.tree(sender)))
            broadcast_id = ids.uuid7()
            value = {"broadcast_id": broadcast_id, "recipients": list(recipients), "fingerprint": fingerprint}
            command = BroadcastToSubtree(sender.session_id, broadcast_id, run_id, body, mode, recipients,
                                         call if not call.startswith(("key:", "host:")) else None)
            recorded = await self._append(sender, command, digest, value) or value
        if recorded["fingerprint"] != fingerprint:
            raise Rejected(Code.SUBTREE_IDEMPOTENCY_CONFLICT,
                           "this call was already used to broadcast another message; make a new call to broadcast again")
        return Broadcast(recorded["broadcast_id"], run_id, body, mode, tuple(recorded["recipients"]))

    async def finish_broadcast(self, sender: SessionRecord, broadcast: Broadcast, accepted: dict[str, str],
                               refused: dict[str, str]) -> None:
        command = RecordBroadcastDelivery(sender.session_id, broadcast.broadcast_id, tuple(accepted.items()),
                                          tuple(refused.items()))
        await self._append(sender, command, notice_digest("broadcast-delivered", broadcast.broadcast_id), {})

    async def start_stop(self, top: SessionRecord, how: str, reason: str | None, key: str | None,
                         closing_text: str | None = None) -> tuple[str, list[str]]:
        """(stop id, order) of this stop: recorded on the top's stream once per ``key`` (no key: a new one). The
        same key with another ``how``, reason or closing text is a conflict: a retry never turns an interrupt
        into a disposal."""
        digest = notice_digest("subtree-stop", top.session_id, key or ids.uuid7())
        fingerprint = subtree.stop_fingerprint(how, reason, closing_text)
        recorded = await self.store.recorded(top, digest)
        if recorded is None:
            order = [r.session_id for r in subtree.bottom_up(top, await self.tree(top))]
            value = {"stop_id": ids.uuid7(), "order": order, "fingerprint": fingerprint}
            command = StopSubtree(top.session_id, value["stop_id"], how, tuple(order), reason)
            recorded = await self._append(top, command, digest, value) or value
        # A stop recorded before stops kept their fingerprint is taken as this one's.
        if recorded.get("fingerprint", fingerprint) != fingerprint:
            raise Rejected(Code.SUBTREE_IDEMPOTENCY_CONFLICT,
                           "this idempotency_key already started a stop with another how, reason or closing text; "
                           "use a new key to stop again")
        return recorded["stop_id"], list(recorded["order"])

    async def seal(self, top: SessionRecord, stop_id: str, order: list[str]) -> list[str]:
        """Seal every session of ``top``'s subtree (``SealSession``), then the order to dispose it in: the recorded
        ``order``, with any session registered under the subtree since it was recorded placed before its
        parent. A sealed session takes no new child (its registration checks the parent in the same atomic
        step), so once a pass finds every session sealed, none can join the subtree any more."""
        sealed: set[str] = set()
        while True:
            subtree_now = subtree.bottom_up(top, await self.tree(top))
            fresh = [r for r in subtree_now if r.session_id not in sealed]
            if not fresh:
                break
            # Top-down: a parent is sealed before its children, so none of them can gain a child meanwhile.
            for record in reversed(fresh):
                await self.sessions.execute(SealSession(record.session_id, stop_id), record)
                sealed.add(record.session_id)
        late = [r.session_id for r in subtree_now if r.session_id not in order]
        if not late:
            return order
        # Late children go first: deepest-first among themselves, each before its ancestors, all of which follow.
        return [sid for sid in (r.session_id for r in subtree_now) if sid in late or sid in order]

    async def interrupt(self, record: SessionRecord, stop_id: str, by: SessionRecord, reason: str) -> bool:
        """The session's open run interrupted (once per stop); False when it had none open."""
        command = InterruptRun(record.session_id, ids.uuid7(), by.session_id, by.handle or by.session_id, reason)
        done = await self._append(record, command, notice_digest("subtree-interrupt", stop_id, record.session_id),
                                  {"interrupt_id": command.interrupt_id})
        return done is not None
