"""Draining: the whole service, or a session and everything below it.

A subtree drain is an event on every session of the subtree (``by`` names
its top), so each send decision finds it in the states it already loads; a
session registered under a draining one inherits the drain. Mail already
accepted is still delivered: a drain refuses only new sends.
"""

from ..adapters.eventstore import EventStore
from ..domain.commands import DrainSession, LiftDrain
from ..domain.records import SessionRecord
from . import servicedrain
from .sessions import SessionService


class DrainService:
    def __init__(self, store: EventStore, sessions: SessionService) -> None:
        self.store = store
        self.sessions = sessions

    async def drain(self, session_id: str | None = None) -> int:
        """Returns the number of sessions now draining because of this call (0 for the whole service)."""
        if session_id is None:
            await servicedrain.set_service_drain(self.store, True)
            return 0
        # The top first: a session registered meanwhile inherits from its ancestors (``inherit``).
        subtree = await self._subtree(await self.sessions.record(session_id))
        for record in subtree:
            await self.sessions.execute(DrainSession(record.session_id, session_id), record)
        return len(subtree)

    async def undrain(self, session_id: str | None = None) -> int:
        if session_id is None:
            await servicedrain.set_service_drain(self.store, False)
            return 0
        subtree = await self._subtree(await self.sessions.record(session_id))
        for record in subtree:
            await self.sessions.execute(LiftDrain(record.session_id, session_id), record)
        return len(subtree)

    async def inherit(self, record: SessionRecord) -> None:
        """A new session takes every drain of its ancestors (read after its registration is durable, so a
        drain whose fan-out missed it was already on an ancestor)."""
        ancestors = await self._ancestors(record)
        if not ancestors:
            return
        loaded = await self.store.load_many(ancestors)
        for by in sorted(set().union(*(loaded[a.session_id].state.drained_by for a in ancestors))):
            await self.sessions.execute(DrainSession(record.session_id, by), record)

    async def _ancestors(self, record: SessionRecord) -> list[SessionRecord]:
        out: list[SessionRecord] = []
        parent_id = record.parent_session_id
        while parent_id is not None:
            parent = await self.store.directory.get(parent_id)
            if parent is None:
                break
            out.append(parent)
            parent_id = parent.parent_session_id
        return out

    async def _subtree(self, top: SessionRecord) -> list[SessionRecord]:
        members = await self.store.directory.tree_members(top.partition, top.root_session_id)
        records = [r for r in (await self.store.directory.many(members)).values() if r is not None]
        children: dict[str, list[SessionRecord]] = {}
        for r in records:
            children.setdefault(r.parent_session_id, []).append(r)
        out, frontier = [top], [top]
        while frontier:
            frontier = [c for r in frontier for c in children.get(r.session_id, [])]
            out.extend(frontier)
        return out
