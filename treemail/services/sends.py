"""Deciding a batch of SendMessage commands: load, decide, append atomically, answer.

Commands of one batch are decided in order against an in-memory copy of each
session's state, so several sends to one recipient chain their expected etags
in one pipeline. A batch's first round may decide on the states the worker
already holds (``heldreads``), keeping only decisions whose own append checks
every state they read. A conflict (another writer appended first) sends the
command round again with freshly loaded state; nothing unconfirmed is trusted
across rounds, so any number of workers may race.

Over the house's 200 lines: one batch's resolve, load, decide and commit read in order.
"""

from dataclasses import dataclass, field
from typing import NamedTuple

from ..adapters import keys, metrics
from ..adapters.codec import encode_answer
from ..adapters.compact import decode_record
from ..adapters.eventstore import EventStore, Loaded, PreparedAppend, Reply, SendReads, parse_append
from ..domain import ids, loops, proof
from ..domain.commands import SendMessage
from ..domain.commitplan import Idempotency, plan_commit
from ..domain.decide import idempotency, routing
from ..domain.decide.guards import Found, NoSuchHandle, NoSuchSession, Target
from ..domain.decide.send import Accepted, AwaitsApproval, Refused, Replayed, SendDecision, SendGiven, outcome_of
from ..domain.handlers import HANDLERS
from ..domain.messaging import MessagingConfig
from ..domain.records import Peer, SessionRecord
from ..domain.outbound import Sender
from ..domain.state import SessionState
from .clock import SYSTEM_CLOCK, Clock
from .heldreads import HeldReads
from .sendfate import Fate, fate_of

decide_send = HANDLERS[SendMessage].decide
# Batches up to this size are answered by their appends (``Reply``): a small batch saves a whole round
# trip. A larger one shares one answer round trip among all its commands, which costs less than three
# more commands in each append (BENCHMARKS.md: +13 % worker CPU on a backlog of 100-batches).
ANSWERED_BY_APPENDS_UP_TO = 8


class Acknowledge(NamedTuple):
    """A batch's entries: the stream its commands were read from and their entry ids, in order."""

    stream: str
    entry_ids: list


class CommandEntry(NamedTuple):
    """Where a command was read: what its append acknowledges when it answers it."""

    stream: str
    entry_id: str | bytes


@dataclass
class _Work:
    command: SendMessage
    # The tool call's idempotency digest, computed once.
    digest: str = ""
    sender: SessionRecord | None = None
    target: SessionRecord | NoSuchSession | NoSuchHandle | None = None
    new_id: str = ""
    # The time the command was decided at (the clock, read once).
    now: float = 0.0
    # Set when the command's append may answer it and acknowledge the entry.
    entry: CommandEntry | None = None
    # Loop detection: the nearest common ancestor a loop notice goes to, once a decision asked for it.
    wants_ancestor: bool = False
    ancestor: SessionRecord | None = None
    ancestor_looked: bool = False


class Answered(NamedTuple):
    work: _Work
    outcome: dict


class Appended(NamedTuple):
    work: _Work
    outcome: dict
    prepared: PreparedAppend


class RecordedAlone(NamedTuple):
    work: _Work
    # The refusal's idempotency record, kept alone under the tool call.
    record: list | dict


@dataclass
class SortedRound:
    """The commands of a round by fate (``sendfate.Fate``), each list in batch order."""

    answered: list[Answered] = field(default_factory=list)
    appended: list[Appended] = field(default_factory=list)
    recorded_alone: list[RecordedAlone] = field(default_factory=list)
    again: list[_Work] = field(default_factory=list)


class Decided(NamedTuple):
    outcomes: dict[str, dict]  # command id -> outcome, for every command
    # The entries (ids, as given) whose command's own append already answered it and acknowledged them.
    acknowledged: set


class SendService:
    def __init__(self, store: EventStore, config: MessagingConfig, keyring: proof.Keyring | None = None,
                 clock: Clock = SYSTEM_CLOCK) -> None:
        self.store = store
        self.directory = store.directory
        self.config = config
        # Source proof: every accepted agent message is signed with the current key (None: proofs off).
        self.keyring = keyring
        self.clock = clock
        self.held = HeldReads(store, clock)

    async def decide(self, commands: list[SendMessage], acknowledge: Acknowledge | None = None) -> Decided:
        """Decide every command; appends are durable on return.

        ``acknowledge``: the stream the commands were read from and their entry ids. Where the
        store allows it (``answers_in_commit``) and the batch is small, an append that applies also answers
        its command and acknowledges its entry: the caller answers only the others.
        """
        outcomes: dict[str, dict] = {}
        acknowledged: set = set()
        work = [_Work(c, idempotency.key_digest(c.context)) for c in commands]
        if acknowledge is not None and self.store.answers_in_commit and len(commands) <= ANSWERED_BY_APPENDS_UP_TO:
            for w, entry_id in zip(work, acknowledge.entry_ids):
                w.entry = CommandEntry(acknowledge.stream, entry_id)
        held_first = True
        while work:
            work = await self._round(work, outcomes, acknowledged, held_first)
            held_first = False
        return Decided(outcomes, acknowledged)

    async def _resolve(self, work: list[_Work]) -> None:
        """Sender and recipient records; handles are looked up in the sender's tree only."""
        senders = await self.directory.many([w.command.context.session_id for w in work])
        for w in work:
            w.sender = senders[w.command.context.session_id]
        by_uuid = await self.directory.many(
            [w.command.arguments.to.lower() for w in work if ids.is_uuid(w.command.arguments.to)]
        )
        handles = await self.directory.handle_owners(
            [(w.sender.partition, w.sender.root_session_id, w.command.arguments.to) for w in work
             if w.sender is not None and ids.HANDLE_PATTERN.match(w.command.arguments.to)]
        )
        by_handle = await self.directory.many([sid for sid in handles.values() if sid is not None])
        for w in work:
            to = w.command.arguments.to
            if ids.is_uuid(to):
                w.target = by_uuid[to.lower()] or NoSuchSession(to)
                continue
            owner = handles.get((w.sender.partition, w.sender.root_session_id, to)) if w.sender else None
            w.target = (by_handle[owner] if owner else None) or NoSuchHandle(to)
            if isinstance(w.target, NoSuchHandle) and w.sender is not None:
                # The error repairs itself: it lists who the sender can address.
                w.target = NoSuchHandle(to, await self._peers(w.sender))
        for w in work:
            if w.wants_ancestor and not w.ancestor_looked and isinstance(w.target, SessionRecord):
                w.ancestor, w.ancestor_looked = await self._common_ancestor(w.sender, w.target), True

    async def _common_ancestor(self, sender: SessionRecord, recipient: SessionRecord) -> SessionRecord | None:
        """The nearest session above both (a loop notice's reader), walking the directory up from each."""
        lines: list[list[str]] = []
        records: dict[str, SessionRecord] = {}
        for record in (sender, recipient):
            line = [record.session_id]
            while record is not None and record.parent_session_id and len(line) <= loops.MAX_DEPTH:
                record = await self.directory.get(record.parent_session_id)
                if record is not None:
                    records[record.session_id] = record
                    line.append(record.session_id)
            lines.append(line)
        found = loops.common_ancestor(*lines)
        return records.get(found) if found else None

    async def _peers(self, sender: SessionRecord) -> list[Peer]:
        """Everyone else in the sender's tree the routing policy lets it address, with their status, in one
        round trip (the domain filters, sorts and bounds the list)."""
        return routing.addressable(self.config.routing, sender, await self.directory.tree_peers(sender))

    @staticmethod
    def _reading(work: list[_Work]) -> tuple[list[SessionRecord], list[SessionRecord]]:
        """The sessions whose states the batch reads, and its senders."""
        records: dict[str, SessionRecord] = {}
        for w in work:
            if w.sender is not None:
                records[w.sender.session_id] = w.sender
            if isinstance(w.target, SessionRecord):
                records[w.target.session_id] = w.target
            if w.ancestor is not None:
                records[w.ancestor.session_id] = w.ancestor
        return list(records.values()), [w.sender for w in work if w.sender is not None]

    async def _load(self, work: list[_Work]) -> SendReads:
        """Every sender's and recipient's state, each tool call's idempotency record, the senders' tree
        grants, and whether the whole service drains (the service-wide drain flag, read every fresh round, so a send decided
        again after a conflict sees a drain that began meanwhile), in one round trip.

        A recorded tool call is answered from its record before any check;
        the commit script checks the record again atomically, for two
        deliveries of one command decided at once.
        """
        records, senders = self._reading(work)
        calls = [(sender, w.digest) for w in work if (sender := w.sender) is not None]
        reads = await self.store.load_for_sends(records, calls, senders)
        self.held.remember(reads)
        return reads

    def _decide_one(self, w: _Work, reads: SendReads) -> SendDecision:
        loaded, grants = reads.loaded, reads.tree_grants
        sender = loaded[w.sender.session_id] if w.sender else None
        target: Target = w.target
        version = 0
        if isinstance(target, SessionRecord):
            target, version = Found(target, loaded[target.session_id].state), loaded[target.session_id].version
        given = SendGiven(
            sender=w.sender, sender_state=sender.state if sender else SessionState(),
            sender_version=sender.version if sender else 0, target=target, config=self.config,
            tree_grants=grants.get(w.sender.root_session_id, frozenset()) if w.sender else frozenset(),
            new_id=ids.uuid7(), now=self.clock.now(),
            recorded=reads.recorded.get((w.sender.session_id, w.digest)) if w.sender else None,
            service_draining=reads.service_draining, target_version=version, keyring=self.keyring,
            ancestor=self._ancestor(w, loaded), ancestor_looked=w.ancestor_looked,
        )
        w.new_id, w.now = given.new_id, given.now
        return decide_send(w.command, given)

    @staticmethod
    def _ancestor(w: _Work, loaded: dict[str, Loaded]) -> Sender | None:
        held = loaded.get(w.ancestor.session_id) if w.ancestor is not None else None
        return Sender(w.ancestor, held.state, held.version) if held is not None else None

    async def _round(self, work: list[_Work], outcomes: dict[str, dict], acknowledged: set, held_first: bool = False
                     ) -> list[_Work]:
        """One round: decided on held states when ``held_first`` and they are all held (``heldreads``),
        otherwise on a fresh read. Returns the commands to decide again."""
        await self._resolve(work)
        reads = self.held.reads(*self._reading(work)) if held_first else None
        on_held = reads is not None
        if reads is None:
            reads = await self._load(work)
        metrics.HELD_ROUNDS.labels("held" if on_held else "fresh").inc()
        sorted_ = self._sort(work, reads, on_held)
        if sorted_ is None:
            metrics.HELD_ROUNDS.labels("discarded").inc()
            return work  # kept without an etag check: decide the batch again, fresh
        for answered in sorted_.answered:
            outcomes[answered.work.command.command_id] = answered.outcome
        if not sorted_.appended and not sorted_.recorded_alone:
            return sorted_.again
        retry = sorted_.again + await self._commit(sorted_, outcomes, acknowledged)
        # Counted as before this round was sorted by fate: the commands waiting for their ancestor with
        # those whose append conflicted.
        metrics.CONFLICT_ROUNDS.inc(len(retry))
        if on_held:
            self.held.contended(len(retry), len(sorted_.appended))
        return retry

    def _sort(self, work: list[_Work], reads: SendReads, on_held: bool) -> SortedRound | None:
        """Each command decided, in order, and sorted by its fate (``sendfate``); an append is prepared on the
        states the appends before it leave. None when the round is discarded (``Fate.DISCARD``)."""
        sorted_ = SortedRound()
        for w in work:
            decision = self._decide_one(w, reads)
            match fate_of(decision, w.sender, w.target, on_held):
                case Fate.AGAIN:
                    w.wants_ancestor = True  # decided again once its nearest common ancestor is loaded
                    sorted_.again.append(w)
                case Fate.DISCARD:
                    return None
                case Fate.RECORDED_ALONE:
                    record = idempotency.record(w.command.arguments, outcome_of(decision))
                    sorted_.recorded_alone.append(RecordedAlone(w, record))
                case Fate.ANSWERED:
                    sorted_.answered.append(Answered(w, outcome_of(decision)))
                case Fate.APPENDED:
                    outcome = outcome_of(decision)
                    prepared = self._prepare(w, decision, outcome, reads.loaded, reads.service_draining)
                    sorted_.appended.append(Appended(w, outcome, prepared))
        return sorted_

    async def _commit(self, sorted_: SortedRound, outcomes: dict[str, dict], acknowledged: set) -> list[_Work]:
        """The round's appends and lone records in one round trip; returns the commands whose append
        conflicted (another writer appended first), to decide again."""

        def build(pipe) -> None:
            for appended in sorted_.appended:
                self.store.commit_call(appended.prepared, pipe)
            for alone in sorted_.recorded_alone:
                self.store.record_outcome_call(alone.work.sender, alone.work.digest, alone.record, pipe)

        replies = iter(await self.store.run_pipeline(build))
        conflicted: list[_Work] = []
        for (w, outcome, prepared), reply in zip(sorted_.appended, replies):
            result = parse_append(reply)
            if result.status == "ok":
                outcomes[w.command.command_id] = outcome
                # Only an append that carried the answer acknowledged the entry: an approval request's does
                # not, and its command is answered with the others (else it waited for a reclaim).
                if prepared.answers:
                    acknowledged.add(w.entry.entry_id)
            elif result.status == "dup":
                outcomes[w.command.command_id] = idempotency.replayed_outcome(result.record, w.command.arguments)
            else:
                conflicted.append(w)
        for alone in sorted_.recorded_alone:
            _set_once, kept = next(replies), next(replies)  # ``record_outcome_call``: set once, read back
            # The record kept (ours, or a concurrent decision's of the same call) is the answer.
            outcomes[alone.work.command.command_id] = idempotency.replayed_outcome(
                decode_record(kept), alone.work.command.arguments)
        return conflicted

    def _prepare(self, w: _Work, decision: SendDecision, outcome: dict, loaded: dict[str, Loaded], draining: bool
                 ) -> PreparedAppend | None:
        """The append a decision needs, chained on the state earlier commands of the batch left; None if none."""
        reply = None
        match decision:
            case AwaitsApproval(events=[]) | Refused(recorded=False) | Replayed():
                return None
            case AwaitsApproval(events=events):
                # The request goes on the sender's stream, atomically: either whole or not at all.
                session, sources, kept, folded = w.sender, [], None, None
            case Accepted() | Refused():
                events = decision.events
                folded = decision.state_after if isinstance(decision, Accepted) else None
                session = w.target
                kept = Idempotency(w.sender.session_id, w.digest, idempotency.record(w.command.arguments, outcome))
                # The sender's records of this intent, appended in the same step (its capacity is exact).
                sources = decision.sources
                if w.entry is not None:  # the decision's own append: it may answer the command
                    reply = Reply(keys.reply_list(w.command.reply_to),
                                  encode_answer(w.command.command_id, outcome), *w.entry)
        before = loaded[session.session_id]
        plan = plan_commit(
            session, before.state, before.version, events, policy=self.config, now=w.now, folded=folded,
            sources=sources, idempotency=kept, read_draining=draining,
            new_mail=(w.new_id,),  # made for this decision (uuid7): no item can have it yet
        )
        prepared = self.store.prepare(plan, before, held=loaded, reply=reply)
        loaded[session.session_id] = prepared.loaded
        loaded.update(prepared.sources)
        return prepared
