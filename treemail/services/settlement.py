"""Settlement notices: a child's run ended for good, or it was disposed; tell its parent.

The notice is decided with the finish (``FinishRun``) or the close
(``CloseSession``) that earns it and written in the same atomic step, the
child's ``SessionSettled`` on its stream and the notice on its parent's
(``decide.settlement``): a host killed at any point leaves both or neither,
and a repeated finish or disposal writes neither twice. A parent whose state
cannot be read at all never fails the child's end: the finish is decided
again without it, logged and counted.
"""

import logging

from ..adapters import metrics
from ..domain import events as ev
from ..domain import ids, limits, notices
from ..domain.commands import CloseSession, FinishRun, Settle
from ..domain.decide.obligations import RUN_FINISHED, WAKE_UNCLAIMED
from ..domain.decide.settlement import UNREADABLE_PARENT
from ..domain.errors import LifecycleError, UnknownSessionError
from ..domain.records import SessionRecord
from .sessions import SessionService

log = logging.getLogger("treemail.settlement")


def check_stop_reason(reason) -> None:
    """Any stop reason a host reports is accepted (one treemail does not know is worded generically), bounded."""
    limits.require_name("stop reason", reason, optional=True)


def check_closing_text(closing) -> str | None:
    """The closing message a host gave (a string, or the child's last content blocks) as the notice carries
    it (``notices.closing_message``), bounded; None: no closing message (an empty one included)."""
    text = notices.closing_message(closing)
    if text is not None:
        limits.require_text("closing_text", text, limits.MAX_CLOSING_TEXT_BYTES)
    return text


def settlement_for(record: SessionRecord, stop_reason: str, closing_text: str | None,
                   parent_unreadable: bool = False) -> Settle:
    return Settle(stop_reason, closing_text, ids.uuid7(), record.parent_session_id, record.handle,
                  parent_unreadable)


def gate_of(events: list[ev.Event]) -> str | None:
    return next((e.notice for e in events if isinstance(e, ev.SessionSettled)), None)


def observe_attempts(events: list[ev.Event]) -> None:
    """Failed delivery attempts a finish decided, in the host's registry."""
    for event in events:
        if isinstance(event, ev.ProducerMessageParked) and event.reason:
            metrics.FAILED_ATTEMPTS.labels(event.reason, "parked").inc()
        elif isinstance(event, ev.ProducerMessageReleased) and event.reason in (RUN_FINISHED, WAKE_UNCLAIMED):
            metrics.FAILED_ATTEMPTS.labels(event.reason, "released").inc()
    metrics.count_steer_fallbacks(events)  # flow control: steer mail the run ended without taking


class SettlementService:
    def __init__(self, sessions: SessionService) -> None:
        self.sessions = sessions
        self.store = sessions.store

    async def finish(self, session_id: str, run_id: str, reason: str | None, closing_text: str | None
                     ) -> str | None:
        """The run ends; given a ``reason`` its end is settled with the parent in the same step. Returns the
        gate (``not_announced``, ``parent_unavailable``, ``injected``, ``queued``, ``steered``, or ``failed``:
        the parent could not be read), or None without a reason."""
        record = await self.sessions.record(session_id)
        if reason is None:
            observe_attempts(await self.sessions.execute(FinishRun(session_id, run_id, "completed"), record))
            return None
        try:
            events = await self.sessions.execute(
                FinishRun(session_id, run_id, reason, settlement_for(record, reason, closing_text)), record)
        except (LifecycleError, UnknownSessionError):
            raise
        except Exception:  # noqa: BLE001 - the parent's state is unreadable: the child's end must stand anyway
            log.warning("settlement notice was not delivered to its parent (session %s)", session_id, exc_info=True)
            metrics.SETTLEMENT_FAILURES.inc()
            events = await self.sessions.execute(
                FinishRun(session_id, run_id, reason, settlement_for(record, reason, closing_text, True)), record)
        observe_attempts(events)
        gate = gate_of(events)
        if gate is None:  # a repeated finish: what the first one told the parent
            gate = (await self.store.load(record)).state.settled_notice or None
        return gate

    async def close(self, record: SessionRecord, returned: tuple, stop_reason: str | None,
                    closing_text: str | None) -> tuple[list[ev.Event], str | None]:
        """``CloseSession``, settling the disposal with the parent when it has a stop reason."""
        settle = settlement_for(record, stop_reason, closing_text) if stop_reason is not None else None
        try:
            events = await self.sessions.execute(CloseSession(record.session_id, returned, settle), record)
        except (LifecycleError, UnknownSessionError):
            raise
        except Exception:  # noqa: BLE001 - as for a finish
            if settle is None:
                raise
            log.warning("settlement notice was not delivered to its parent (session %s)", record.session_id,
                        exc_info=True)
            metrics.SETTLEMENT_FAILURES.inc()
            settle = settlement_for(record, stop_reason, closing_text, True)
            events = await self.sessions.execute(CloseSession(record.session_id, returned, settle), record)
        return events, gate_of(events) if settle is not None else None


__all__ = ["SettlementService", "check_stop_reason", "check_closing_text", "UNREADABLE_PARENT"]
