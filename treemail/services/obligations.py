"""Keeping delivery obligations (mail as an obligation): what the delivery pump and ``reconcile`` do.

Everything is rediscovered from storage the commit step derives from the
streams: the partition's due index says which sessions need a look and
when, and each look is one ``KeepObligations`` command decided on the
session's state and mail. The pump acts only through that command, so any
number of pumps (or a pump and a reconcile) can race: a decision made on a
state another one already changed fails its etag check and is decided again.
"""

import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from ..adapters import keys, metrics, outboundindex, tracing
from ..domain import events as ev
from ..domain.commands import KeepObligations
from ..domain.decide.stranded import disposal_cut_off, needs_a_look
from ..domain.errors import LifecycleError, UnknownSessionError
from ..domain.records import SessionRecord
from ..domain.state import MailItem, SessionState
from . import population
from .clock import SYSTEM_CLOCK, Clock
from .disposal import DisposalService
from .population import SweepPosition
from .sessions import SessionService

log = logging.getLogger("treemail.pump")


@dataclass
class Pass:
    """What one pass did: sessions kept, events appended, and the lag it began with; for a sweep, the sessions
    whose state it read (``looked``)."""

    sessions: int = 0
    events: list[ev.Event] = field(default_factory=list)
    lag_s: float = 0.0
    looked: int = 0

    @property
    def wakes(self) -> int:
        return sum(isinstance(e, ev.SessionWakeRequested) for e in self.events)


class ObligationService:
    def __init__(self, sessions: SessionService, clock: Clock = SYSTEM_CLOCK,
                 disposal: DisposalService | None = None) -> None:
        """``disposal``: completes the disposals the look finds cut off (None: it leaves them)."""
        self.sessions = sessions
        self.clock = clock
        self.disposal = disposal
        self.store = sessions.store
        self.redis = sessions.store.redis
        self.partitions = list(range(sessions.config.service.partitions))

    async def find_sent(self, message_id: str, partitions: list[int]) -> outboundindex.Found | None:
        """The sender's records of ``message_id`` in the outbound index of these partitions, if any holds them."""
        return await outboundindex.find(self.redis, message_id, partitions)

    async def keep(self, session_id: str, stale_before: float = 0.0, refresh: bool = True) -> list[ev.Event]:
        """Decide ``KeepObligations`` for one session; ``refresh`` rewrites its due entry even when idle."""
        try:
            record = await self.sessions.record(session_id)
            # The spans of what the pump does belong to each message's own trace.
            mail = await self.store.load_mail(record) if tracing.enabled() else {}
            events = await self.sessions.execute(KeepObligations(session_id, stale_before), record,
                                                 refresh_index=refresh)
        except (UnknownSessionError, LifecycleError):
            return []  # a session gone from the directory, or never registered: nothing is owed
        self._observe(session_id, events, mail)
        return events

    @staticmethod
    def _observe(session_id: str, events: list[ev.Event], mail: dict[str, MailItem]) -> None:
        for event in events:
            match event:
                case ev.ProducerMessageReleased():
                    action = "released"
                case ev.ProducerMessageParked():
                    action = "parked"
                case ev.SessionWakeRequested():
                    metrics.OBLIGATIONS.labels("woken").inc()
                    continue
                case ev.ProducerMessageStranded():
                    metrics.OBLIGATIONS.labels("stranded").inc()
                    log.warning("message %s on session %s can no longer end (%s): reported as stranded; "
                                "`treemail inspect` shows it, a cancel discards it", event.message_id, session_id,
                                event.reason)
                    continue
                case ev.ProducerMessageSteerFellBack():  # flow control: the steer deadline
                    metrics.STEER_FALLBACKS.labels(event.reason).inc()
                    continue
                case _:
                    continue
            metrics.OBLIGATIONS.labels(action).inc()
            item = mail.get(event.message_id)
            if item is not None:
                with tracing.span(f"treemail.{'park' if action == 'parked' else 'release'}", item.trace or None,
                                  message_id=event.message_id, session_id=session_id,
                                  reason=getattr(event, "reason", None), attempts=item.attempts):
                    pass

    async def sweep(self, stale_before: float = 0.0) -> Pass:
        """Every session with pending mail, in every partition: the pump's first pass, and ``reconcile``.

        It also rewrites each such session's due entry, so an index that
        lost entries (or mail stored before the index existed) is complete again.
        """
        async def keep(record: SessionRecord) -> list[ev.Event]:
            return await self.keep(record.session_id, stale_before)

        done, _ = await self._keep_slice(lambda state: state.pending_all > 0, SweepPosition(), None, keep)
        return done

    async def sweep_stranded(self, start: SweepPosition = SweepPosition(),
                             budget: int | None = None) -> tuple[Pass, SweepPosition | None]:
        """Every closed session still holding mail, in every partition, kept (``KeepObligations`` reports each
        message no rule can end any more, once): what the due index alone would miss, a state an older version
        left with no due entry. And every disposal its host left half done, completed (``disposal_cut_off``).

        A slice of it: from ``start``, until about ``budget`` sessions' states are read (None: all of them).
        Returns the slice's pass and where the next slice starts, None once every partition is read, so a
        population's whole sweep need not hold up one pump pass."""
        return await self._keep_slice(needs_a_look, start, budget, self._look)

    async def _keep_slice(self, wanted: Callable[[SessionState], bool], start: SweepPosition, budget: int | None,
                          act: Callable[[SessionRecord], Awaitable[list[ev.Event]]]
                          ) -> tuple[Pass, SweepPosition | None]:
        """``act`` for the stored sessions whose state is ``wanted``, from ``start`` until about ``budget`` states
        are read (``population.slices``)."""
        done = Pass()
        position = start if start.partition < len(self.partitions) else None
        async for read in population.slices(self.store, self.partitions, wanted, start, budget):
            done.looked += read.looked
            for record in read.wanted:
                done.sessions += 1
                done.events.extend(await act(record))
            position = read.next
        return done, position

    async def _look(self, record: SessionRecord) -> list[ev.Event]:
        """A session the look stopped at: a disposal cut off after its cutoff is completed, anything else kept."""
        loaded = await self.store.load(record)
        if loaded.state.disposal != "closing":
            return await self.keep(record.session_id)
        if self.disposal is None:
            return []
        now = self.clock.now()
        closing_at = max((e.at for _, e in await self.store.read(record) if isinstance(e, ev.SessionClosing)),
                         default=now)
        if not disposal_cut_off(loaded.state, closing_at, now, self.sessions.config.messaging.stranded_sweep_s):
            return []  # a disposal under way: its host completes it
        log.warning("session %s has been closing for %.0f s: its host stopped after the cutoff; completing the "
                    "disposal", record.session_id, now - closing_at)
        try:
            await self.disposal.complete_interrupted(record.session_id)
        except (LifecycleError, UnknownSessionError) as error:  # tried again at the next look
            log.warning("completing the disposal of session %s: %s", record.session_id, error)
            return []
        metrics.OBLIGATIONS.labels("disposal_completed").inc()
        return [e for _, e in await self.store.read(record, after=loaded.version)]

    async def step(self, limit: int = 500, now: float | None = None) -> Pass:
        """Every session whose due time has come, at most ``limit`` per partition."""
        now = self.clock.now() if now is None else now
        done = Pass()
        for partition in self.partitions:
            entries = await self.redis.zrangebyscore(keys.due_index(partition), "-inf", now, start=0, num=limit,
                                                     withscores=True)
            if entries:
                done.lag_s = max(done.lag_s, now - min(score for _, score in entries))
            for member, _ in entries:
                done.sessions += 1
                done.events.extend(await self.keep(member.decode() if isinstance(member, bytes) else member))
        metrics.PUMP_PASSES.inc()
        metrics.PUMP_LAG_SECONDS.set(done.lag_s)
        return done
