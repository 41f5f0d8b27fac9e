"""Disposal: closing, every pending message returned or set aside, closed; then the settlement.

Each step is repeatable, so a disposal interrupted anywhere (the host killed,
the server restarting) is completed by calling ``dispose`` again: the cutoff
is not opened twice, a notice is never written twice (``append_once``), and
the session closes only once every pending agent message was returned.
"""

from dataclasses import dataclass

from ..adapters.eventstore import EventStore
from ..domain import events as ev
from ..domain import ids
from ..domain.commands import DisposeSession, ReturnMail
from ..domain.decide.disposal import returned_reason
from ..domain.decide.lifecycle import Given
from ..domain.errors import LifecycleError
from ..domain.handlers import HANDLERS
from ..domain.records import SessionRecord
from ..domain.state import NEXT_INCARNATION
from .appendonce import append_once, notice_digest
from .clock import SYSTEM_CLOCK, Clock
from .sessions import SessionService
from .settlement import SettlementService

decide_return_mail = HANDLERS[ReturnMail].decide
# Closing refuses while agent mail is pending and not returned; only mail accepted before the
# cutoff can be pending, so a second pass finds none. More passes mean something else is wrong.
RETURN_PASSES = 5
UNREADABLE = "(its text can no longer be read)"


@dataclass(frozen=True)
class Disposed:
    # message id -> what became of it (the discard reason written on the disposed session)
    returned: dict[str, str]
    # the settlement notice's gate, or None when no stop reason was given
    settlement: str | None


class DisposalService:
    def __init__(self, store: EventStore, sessions: SessionService, settlement: SettlementService,
                 clock: Clock = SYSTEM_CLOCK) -> None:
        self.store = store
        self.sessions = sessions
        self.settlement = settlement
        self.clock = clock

    async def dispose(
        self, session_id: str, stop_reason: str | None = None, closing_text: str | None = None
    ) -> Disposed:
        record = await self.sessions.record(session_id)
        await self.sessions.execute(DisposeSession(session_id, stop_reason, closing_text), record)
        returned: dict[str, str] = {}
        for _ in range(RETURN_PASSES):
            returned.update(await self._return_pending(record, stop_reason, skip=returned))
            try:
                # The close settles the disposal with the parent in the same step (exactly once).
                events, settled = await self.settlement.close(record, tuple(returned.items()), stop_reason,
                                                              closing_text)
                break
            except LifecycleError as error:
                if error.code == "lifecycle:not_closing":
                    # Another disposal of the same incarnation closed it first (and mail held for the next one
                    # resumed it since): the disposal this call joined is complete, its close was that one's.
                    events, settled = [], None
                    break
                if error.code != "lifecycle:unreturned_mail":
                    raise
        else:
            raise LifecycleError("lifecycle:contention", f"session {session_id} kept receiving agent mail while closing")
        if stop_reason is not None and not events:
            # Closed already (a repeated disposal): what the disposal told the parent then.
            state = (await self.store.load(record)).state
            settled = state.settled_notice if state.settled == "disposed" else None
        return Disposed(returned, settled)

    async def complete_interrupted(self, session_id: str) -> Disposed | None:
        """A disposal that stopped after its cutoff (the host died) is completed, with the stop reason and
        closing text its ``SessionClosing`` recorded; None when the session is not closing."""
        record = await self.sessions.record(session_id)
        if (await self.store.load(record)).state.disposal != "closing":
            return None
        closing = [e for _, e in await self.store.read(record) if isinstance(e, ev.SessionClosing)][-1]
        return await self.dispose(session_id, closing.stop_reason, closing.closing_text)

    async def _return_pending(self, record: SessionRecord, stop_reason: str | None, skip) -> dict[str, str]:
        """Hand every pending agent message back to its sender as a notice; message id -> discard reason."""
        mail = await self.store.load_mail(record)
        # Read after the mail: a session no longer closing was closed by another disposal of the same incarnation
        # (and maybe resumed since, its held mail now the new incarnation's, to be delivered): nothing of it is
        # this call's to return. Had that close come after the mail was read, its held mail still reads as held.
        state = (await self.store.load(record)).state
        if state.disposal != "closing":
            return {}
        # Mail sent while it closed waits for its next incarnation: it is not the disposal's to return, unless a
        # cascading stop sealed the session (there is no next incarnation then).
        for_good = state.sealed
        items = sorted((m for m in mail.values() if m.owner == "agent" and m.message_id not in skip
                        and (m.reason != NEXT_INCARNATION or for_good)), key=lambda m: m.seq)
        if not items:
            return {}
        bodies = await self.store.read_at(record, [m.seq for m in items])
        senders = await self.store.directory.many([m.sender_session_id for m in items])
        reasons: dict[str, str] = {}
        for item in items:
            sender = senders.get(item.sender_session_id)
            notice_id = None
            if sender is not None:
                # An entry that no longer reads (trimmed, or a newer protocol's) is still returned, without its text.
                body = getattr(bodies.get(item.seq), "body", UNREADABLE)
                command = ReturnMail(
                    sender.session_id, item.message_id, ids.uuid7(), record.address, body, stop_reason
                )

                def decide(state, now, command=command):
                    given = Given(state, {}, self.sessions.config.messaging, now)
                    return decide_return_mail(command, given), {"message_id": command.notice_id}

                recorded = await append_once(self.store, self.clock, sender, decide, notice_digest("returned", item.message_id),
                                             self.sessions.config.messaging)
                notice_id = recorded["message_id"] if recorded else None
            reasons[item.message_id] = returned_reason(notice_id)
        return reasons
