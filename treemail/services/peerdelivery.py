"""The peer driver: admits pending peer intents to their destinations, records the answers, brings the
settlement back. Any number of drivers may run (the pump's, the host's first attempt); every step is one
command on one stream under its etag, so two drivers never start one attempt twice or admit twice.

One delivery, as the driver walks it:

    source slot                         destination slot
    DrivePeerDelivery -> PeerAttemptStarted (attempt n)
                                        admission keyed by the message id
                                        (a second attempt after a lost reply
                                        gets the first receipt back)
    RecordPeerAdmission -> MessageSent | MessageRefused | PeerAttemptFailed (+ parked)
    ... the destination consumes or discards it ...
    SettlePeerDelivery -> MessageSettled  (read from the destination's stream)

A driver killed after ``PeerAttemptStarted`` leaves the attempt in flight; once the attempt timeout passes
another driver records it failed and makes the next attempt with the same identity.
"""

import logging
from dataclasses import dataclass, field

from redis.exceptions import RedisError

from ..adapters import outboundindex, tracing
from ..adapters.eventstore import EventStore
from ..adapters.peerdue import PeerDue
from ..domain import digests, ids, outbox, proof
from ..domain import events as ev
from ..domain.commands import DiscardPeerDelivery, DrivePeerDelivery, RecordPeerAdmission, SettlePeerDelivery
from ..domain.decide import idempotency
from ..domain.decide.guards import Found
from ..domain.decide.peerdelivery import AdmissionGiven, decide_admission
from ..domain.decide.send import Refused, outcome_of
from ..domain.errors import Code, LifecycleError, UnknownSessionError
from ..domain.protocol import PROTOCOL_VERSION
from ..domain.records import SessionRecord
from . import population, servicedrain
from .clock import Clock
from .keyedcalls import keyed_write, transact_keyed
from . import transaction
from .transaction import Write
from .sessions import SessionService

log = logging.getLogger("treemail.peers")

# An admission is keyed by its message id: any attempt with that identity gets the first one's answer.
ADMISSIONS = idempotency.Keyed(
    lambda message_id: message_id, Code.PEER_IDEMPOTENCY_CONFLICT, "this admission identity was used for another message",
)
# The destination's stream is read for a settlement in pages of this many events.
SETTLEMENT_PAGE = 256


def admission_digest(message_id: str) -> str:
    return digests.digest(["peer-admission", message_id])


@dataclass
class DriverPass:
    """What one driver pass did: the sources it looked at and the events it appended on their streams
    (attempts, receipts, refusals, parking, settlements; an admission's own events are on its
    destination's stream), which ``treemail.testing`` hands a test as the pump's."""

    sources: int = 0
    events: list[ev.Event] = field(default_factory=list)


class PeerDriver:
    def __init__(self, store: EventStore, sessions: SessionService, keyring: proof.Keyring | None,
                 clock: Clock) -> None:
        self.store = store
        self.sessions = sessions
        self.policy = sessions.config.messaging
        self.partitions = list(range(sessions.config.service.partitions))
        self.keyring = keyring
        self.clock = clock
        self.due = PeerDue(store.redis)

    # ---- passes ------------------------------------------------------------------------------------------

    async def sweep(self) -> int:
        """Every source with outbox rows, whatever the index holds (a driver's first pass). Returns sources."""
        seen = 0
        async for read in population.slices(self.store, self.partitions, lambda state: bool(state.outbox)):
            for record in read.wanted:
                seen += 1
                await self.drive(record)
        return seen

    async def step(self, limit: int = 500) -> DriverPass:
        """Every source whose time has come, at most ``limit`` per partition."""
        now = self.clock.now()
        done = DriverPass()
        for partition in self.partitions:
            for session_id in await self.due.due(partition, now, limit):
                record = await self.store.directory.get(session_id)
                if record is None:
                    continue
                done.sources += 1
                done.events.extend(await self.drive(record))
        return done

    async def drive(self, source: SessionRecord, only: str | None = None) -> list[ev.Event]:
        """Everything due on this source's outbox now (``only``: one delivery), then its next due time.
        Returns the events appended."""
        appended: list[ev.Event] = []
        loaded = await self.store.load(source)
        for row in list(loaded.state.outbox.values()):
            if only is not None and row.message_id != only:
                continue
            step = outbox.next_step(row, self.policy, self.clock.now())
            try:
                if step is None:
                    continue
                if step.action == "settle":
                    appended += await self._settle(source, row)
                else:
                    appended += await self._advance(source, row.message_id)
            except (UnknownSessionError, LifecycleError):
                return appended  # the source is gone: nothing is owed any more
        loaded = await self.store.load(source)
        await self.due.reschedule(source, loaded.version,
                                  outbox.next_check(loaded.state.outbox, self.policy, self.clock.now()))
        return appended

    # ---- one delivery -------------------------------------------------------------------------------------

    async def _advance(self, source: SessionRecord, message_id: str) -> list[ev.Event]:
        events = await self.sessions.execute(DrivePeerDelivery(source.session_id, message_id), source)
        started = next((e for e in events if isinstance(e, ev.PeerAttemptStarted)), None)
        if started is None:
            return events
        intent = await self.intent(source, message_id)
        if intent is None:
            return events
        if intent.protocol > PROTOCOL_VERSION:
            return events  # a newer treemail stored it: its admission is a newer driver's to make (it times out here)
        # One span per admission attempt, in the message's own trace (from its preparation on).
        with tracing.span("treemail.peer.admit", intent.traceparent, message_id=message_id,
                          session_id=intent.destination_session_id, attempt=started.attempt) as span:
            try:
                outcome = await self.admit(source, intent)
            except (RedisError, OSError) as error:
                # The answer is unknown: the next attempt, with the same identity, finds out.
                log.warning("peer admission of %s unanswered: %s", message_id, type(error).__name__)
                outcome = {"error": {"code": "unanswered"}}
            if span is not None:
                span.set_attribute("treemail.outcome", "accepted" if "ok" in outcome else outcome["error"]["code"])
        return events + await self.sessions.execute(self._record(message_id, started.attempt, outcome, source), source)

    @staticmethod
    def _record(message_id: str, attempt: int, outcome: dict, source: SessionRecord) -> RecordPeerAdmission:
        if "ok" in outcome:
            ok = outcome["ok"]
            return RecordPeerAdmission(source.session_id, message_id, attempt, "accepted",
                                       position=ok["position"], recipient_state=ok["recipient_state"],
                                       sequence=ok.get("sequence"))
        code = outcome["error"]["code"]
        kind = "failed" if code in outbox.TRANSIENT or code == "unanswered" else "refused"
        return RecordPeerAdmission(source.session_id, message_id, attempt, kind, code=code,
                                   notice_id=ids.uuid7() if kind == "refused" else "")

    async def intent(self, source: SessionRecord, message_id: str) -> ev.PeerIntentStored | None:
        """The stored intent: its position is the outbound index's entry until a receipt replaces it."""
        found = await outboundindex.reference(self.store.redis, source.partition, message_id)
        if found is None:
            return None
        _, position = found
        found = (await self.store.read_at(source, [position])).get(position)
        return found if isinstance(found, ev.PeerIntentStored) else None

    async def admit(self, source: SessionRecord, intent: ev.PeerIntentStored) -> dict:
        """One admission attempt: one commit on the destination, keyed by the message id. ``{"ok": receipt}``
        or ``{"error": {"code", "message"}}``; durable on return."""
        destination = await self.store.directory.get(intent.destination_session_id)
        if destination is None:
            return {"error": {"code": Code.UNKNOWN_SESSION.value, "message": "the destination is gone"}}
        digest = admission_digest(intent.message_id)
        recorded = await self.store.recorded(destination, digest)
        if recorded is not None:
            return ADMISSIONS.replayed_outcome(recorded, intent.message_id)

        async def round_(_attempt: int) -> Write:
            loaded = await self.store.load_many([source, destination])
            draining = await servicedrain.service_draining(self.store)
            now = self.clock.now()
            decision = decide_admission(AdmissionGiven(
                intent=intent, sender=source, sender_state=loaded[source.session_id].state,
                target=Found(destination, loaded[destination.session_id].state), config=self.policy, now=now,
                target_version=loaded[destination.session_id].version, service_draining=draining,
                keyring=self.keyring,
            ))
            if isinstance(decision, Refused):
                return Write(outcome_of(decision))
            return keyed_write(ADMISSIONS, intent.message_id, digest, destination, loaded[destination.session_id],
                               decision, policy=self.policy, now=now, read_draining=draining)

        return await transact_keyed(self.store, destination.session_id, ADMISSIONS, intent.message_id, round_,
                                    commit=self.admit_commit)

    async def admit_commit(self, *args) -> dict | object:
        """The admission's one commit (a test drops its reply here to prove a second attempt admits nothing)."""
        return await transaction.commit(*args)

    async def discard(self, source: SessionRecord, message_id: str, reason: str = "") -> None:
        """Give up on a parked delivery (LifecycleError if it is not parked). An admission that did land (an
        attempt whose reply was lost before it parked) is recorded instead: the destination holds the message,
        so only its settlement may release it."""
        row = (await self.store.load(source)).state.outbox.get(message_id)
        destination = await self.store.directory.get(row.destination) if row is not None else None
        if row is not None and row.status == "parked" and destination is not None:
            recorded = await self.store.recorded(destination, admission_digest(message_id))
            if recorded is not None:
                outcome = ADMISSIONS.replayed_outcome(recorded, message_id)
                await self.sessions.execute(self._record(message_id, row.attempts, outcome, source), source)
                raise LifecycleError("retry_message:not_parked", f"message {message_id} was admitted by its peer; "
                                                                 "it is accepted, not parked")
        await self.sessions.execute(DiscardPeerDelivery(source.session_id, message_id, reason), source)

    async def _settle(self, source: SessionRecord, row: outbox.Row) -> list[ev.Event]:
        """Whether the destination processed the message: gone from its pending mail, and settled on its stream."""
        destination = await self.store.directory.get(row.destination)
        if destination is None:
            return []
        if await self.store.load_mail_items(destination, [row.message_id]):
            return []
        after = row.position
        while True:
            page = await self.store.read(destination, after=after, count=SETTLEMENT_PAGE)
            for seq, event in page:
                after = seq
                if isinstance(event, ev.ProducerMessageConsumed | ev.ProducerMessageDiscarded) and (
                        event.message_id == row.message_id):
                    outcome = "consumed" if isinstance(event, ev.ProducerMessageConsumed) else "discarded"
                    return await self.sessions.execute(SettlePeerDelivery(
                        source.session_id, row.message_id, outcome, getattr(event, "reason", "")), source)
            if len(page) < SETTLEMENT_PAGE:
                return []
