"""Deciding an interrupt_agent call in the host process: resolve, load, decide, append, retry.

An interrupt is rare and touches one session (the target), so it is not worth
a trip through the worker pool: it is decided here with the same command
table and committed with the same atomic step, expected etag and idempotency
record as a send. A conflict (another writer appended first) decides again
on fresh state; a duplicate key answers the first outcome.
"""

from ..adapters.eventstore import EventStore
from ..domain import ids
from ..domain.commands import InterruptAgent
from ..domain.decide import idempotency, interrupt, routing
from ..domain.decide.guards import Found, NoSuchHandle, NoSuchSession, Target
from ..domain.decide.send import Accepted, Refused, outcome_of
from ..domain.handlers import HANDLERS
from ..domain.records import Peer, SessionRecord
from ..domain.state import SessionState
from .clock import SYSTEM_CLOCK, Clock
from .keyedcalls import keyed_write, transact_keyed
from .transaction import Write

decide_interrupt = HANDLERS[InterruptAgent].decide


class InterruptService:
    def __init__(self, store: EventStore, clock: Clock = SYSTEM_CLOCK) -> None:
        self.store = store
        self.directory = store.directory
        self.clock = clock

    async def interrupt(self, command: InterruptAgent) -> dict:
        """The outcome the model is answered: ``{"ok": result}`` or ``{"error": ...}``; durable on return."""
        context, arguments = command.context, command.arguments
        sender = await self.directory.get(context.session_id)
        target_record = await self._resolve(sender, arguments.to)
        recorded = await self._recorded(target_record, interrupt.key_digest(context))
        subject = target_record.session_id if isinstance(target_record, SessionRecord) else arguments.to

        async def round_(_attempt: int) -> Write:
            present = [r for r in (sender, target_record) if isinstance(r, SessionRecord)]
            loaded = await self.store.load_many(present)
            target: Target = target_record
            if isinstance(target_record, SessionRecord):
                target = Found(target_record, loaded[target_record.session_id].state)
            elif isinstance(target_record, NoSuchHandle) and sender is not None:
                target = NoSuchHandle(target_record.reference, await self._neighbours(sender))
            sender_state = loaded[sender.session_id].state if sender else SessionState()
            decision = decide_interrupt(command, interrupt.InterruptGiven(
                sender, sender_state, target, new_id=ids.uuid7(), now=self.clock.now(), recorded=recorded,
            ))
            kept = isinstance(target, Found) and (
                isinstance(decision, Accepted) and not interrupt.is_no_op(decision)
                or isinstance(decision, Refused) and idempotency.answers_retries(decision.code))
            if not kept:
                # No session to keep the answer with (an agent that does not exist), an accepted no-op (a
                # settled, one-shot or idle target: it touches nothing), a replayed answer, or a refusal that
                # says nothing about the call: nothing to append anywhere.
                return Write(outcome_of(decision))
            return keyed_write(
                interrupt.INTERRUPTS, arguments, interrupt.key_digest(context), target.record,
                loaded[target.record.session_id], decision,
            )

        return await transact_keyed(self.store, subject, interrupt.INTERRUPTS, arguments, round_)

    async def _recorded(self, target: SessionRecord | NoSuchSession | NoSuchHandle, digest: str) -> list | dict | None:
        """The outcome this tool call already has: the commit keeps it with the target (the session it appended
        to), and a reference always resolves to the same session."""
        if not isinstance(target, SessionRecord):
            return None
        return await self.store.recorded(target, digest)

    async def _resolve(self, sender: SessionRecord | None, to: str) -> SessionRecord | NoSuchSession | NoSuchHandle:
        """A full UUID, or a handle in the sender's tree only, as for send_message."""
        if ids.is_uuid(to):
            return await self.directory.get(to.lower()) or NoSuchSession(to)
        if sender is None or not ids.HANDLE_PATTERN.match(to):
            return NoSuchHandle(to)
        key = (sender.partition, sender.root_session_id, to)
        owner = (await self.directory.handle_owners([key]))[key]
        return (await self.directory.get(owner) if owner else None) or NoSuchHandle(to)

    async def _neighbours(self, sender: SessionRecord) -> list[Peer]:
        """Who the sender could interrupt by routing: its direct neighbours (the self-repairing list)."""
        members = await self.directory.tree_members(sender.partition, sender.root_session_id)
        records = await self.directory.many([m for m in members if m != sender.session_id])
        present = [r for r in records.values() if r is not None]
        states = await self.store.load_many(present)
        peers = [Peer(r, states[r.session_id].state.status) for r in present]
        return [p for p in peers if routing.direction(sender, p.record) in ("to_parent", "to_child")]
