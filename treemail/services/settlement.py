"""Settlement notices: a child's run ended for good, or it was disposed; tell its parent.

Best effort by design: a notice that cannot be delivered is logged and
counted, and never fails the child's finish or disposal, which are already
durable when this runs.
"""

import logging

from ..adapters import metrics
from ..adapters.eventstore import EventStore
from ..domain import ids
from ..domain.commands import SettleSession
from ..domain.decide.settlement import SettlementGiven, settled_event
from ..domain.handlers import HANDLERS
from .appendonce import append_fixed, append_once, notice_digest
from .clock import SYSTEM_CLOCK, Clock
from .sessions import SessionService

log = logging.getLogger("treemail.settlement")
decide_settle = HANDLERS[SettleSession].decide


class SettlementService:
    def __init__(self, store: EventStore, sessions: SessionService, clock: Clock = SYSTEM_CLOCK) -> None:
        self.store = store
        self.sessions = sessions
        self.clock = clock

    async def settle(
        self, session_id: str, run_id: str | None, stop_reason: str, closing_text: str | None, disposed: bool = False
    ) -> str:
        """The gate that decided (``not_announced``, ``parent_unavailable``, ``injected``, ``queued``,
        ``steered``), or ``failed``. Never raises."""
        try:
            return await self._settle(session_id, run_id, stop_reason, closing_text, disposed)
        except Exception:  # noqa: BLE001 - whatever went wrong, the child's end stands
            log.warning("settlement notice was not delivered to its parent (session %s)", session_id, exc_info=True)
            metrics.SETTLEMENT_FAILURES.inc()
            return "failed"

    async def _settle(self, session_id, run_id, stop_reason, closing_text, disposed) -> str:
        child = await self.sessions.record(session_id)
        # The parent's id is in the child's own record, written once: it resolves whatever became of either.
        parent = await self.store.directory.get(child.parent_session_id) if child.parent_session_id else None
        command = SettleSession(session_id, run_id, stop_reason, closing_text, disposed, ids.uuid7())
        # The child and its parent in one round trip; the child's "announced" never reverts, so it is read once.
        loaded = await self.store.load_many([child] + ([parent] if parent else []))
        child_state = loaded[child.session_id].state

        latest: dict = {}

        def decide(parent_state, now):
            settlement = decide_settle(command, SettlementGiven(child, child_state, parent_state, now))
            latest["notice"] = settlement.notice
            return settlement.parent_events, {"message_id": command.notice_id, "notice": settlement.notice}

        events, _ = decide(loaded[parent.session_id].state if parent else None, self.clock.now())
        recorded = None
        if events:
            key = notice_digest("settled", child.session_id, "disposed" if disposed else run_id)
            recorded = await append_once(self.store, self.clock, parent, decide, key, self.sessions.config.messaging,
                                         first=loaded[parent.session_id])
        # None: nothing was written to the parent (not announced, or the parent is gone, maybe only by now).
        notice = recorded["notice"] if recorded else latest["notice"]
        message_id = recorded["message_id"] if recorded else None
        await append_fixed(self.store, child, [settled_event(command, notice, message_id, self.clock.now())])
        return notice
