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

from dataclasses import dataclass
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

decide_send = HANDLERS[SendMessage].decide
# Batches up to this size are answered by their appends (``Reply``): a small batch saves a whole round
# trip. A larger one shares one answer round trip among all its commands, which costs less than three
# more commands in each append (BENCHMARKS.md: +13 % worker CPU on a backlog of 100-batches).
ANSWERED_BY_APPENDS_UP_TO = 8


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
    # (command stream, entry id): set when the command's append may answer it and acknowledge the entry.
    entry: tuple[str, str | bytes] | None = None
    # Loop detection: the nearest common ancestor a loop notice goes to, once a decision asked for it.
    wants_ancestor: bool = False
    ancestor: SessionRecord | None = None
    ancestor_looked: bool = False


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

    async def decide(self, commands: list[SendMessage], acknowledge: tuple[str, list] | None = None) -> Decided:
        """Decide every command; appends are durable on return.

        ``acknowledge``: the stream the commands were read from and their entry ids, in order. Where the
        store allows it (``answers_in_commit``) and the batch is small, an append that applies also answers
        its command and acknowledges its entry: the caller answers only the others.
        """
        outcomes: dict[str, dict] = {}
        acknowledged: set = set()
        work = [_Work(c, idempotency.key_digest(c.context)) for c in commands]
        if acknowledge is not None and self.store.answers_in_commit and len(commands) <= ANSWERED_BY_APPENDS_UP_TO:
            for w, entry_id in zip(work, acknowledge[1]):
                w.entry = (acknowledge[0], entry_id)
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

    @staticmethod
    def _discarded(work: list[_Work]) -> list[_Work]:
        metrics.HELD_ROUNDS.labels("discarded").inc()
        return work

    @staticmethod
    def _checked_by_its_append(w: _Work, decision: SendDecision, prepared: PreparedAppend | None) -> bool:
        """Whether the append checks every state the decision read (``heldreads``): it is on the recipient's
        stream, and the sender's record rides along as a source (or the sender is the recipient)."""
        if prepared is None or not isinstance(decision, (Accepted, Refused)):
            return False
        return w.sender.session_id in prepared.sources or w.sender.session_id == w.target.session_id

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
        loaded = reads.loaded
        committing: list[tuple[_Work, dict]] = []
        appends: list[PreparedAppend] = []
        alone: list[tuple[_Work, dict]] = []
        wanting: list[_Work] = []
        for w in work:
            decision = self._decide_one(w, reads)
            if isinstance(decision, Refused) and decision.ancestor_wanted:
                w.wants_ancestor = True  # decided again once its nearest common ancestor is loaded
                wanting.append(w)
                continue
            if on_held and (w.sender is None or isinstance(decision, Refused) and decision.recorded_alone):
                return self._discarded(work)  # kept without an etag check: decide the batch again, fresh
            if isinstance(decision, Refused) and decision.recorded_alone and w.sender is not None:
                alone.append((w, idempotency.record(w.command.arguments, outcome_of(decision))))
                continue
            outcome = outcome_of(decision)
            prepared = self._prepare(w, decision, outcome, loaded, reads.service_draining)
            if on_held and not self._checked_by_its_append(w, decision, prepared):
                return self._discarded(work)
            if prepared is None:
                outcomes[w.command.command_id] = outcome
                continue
            appends.append(prepared)
            committing.append((w, outcome))
        if not committing and not alone:
            return wanting

        def build(pipe) -> None:
            for prepared in appends:
                self.store.commit_call(prepared, pipe)
            for w, record in alone:
                self.store.record_outcome_call(w.sender, w.digest, record, pipe)

        replies = await self.store.run_pipeline(build)
        kept = replies[len(appends):]
        for index, (w, _) in enumerate(alone):
            # The record kept (ours, or a concurrent decision's of the same call) is the answer.
            outcomes[w.command.command_id] = idempotency.replayed_outcome(
                decode_record(kept[2 * index + 1]), w.command.arguments
            )
        retry: list[_Work] = wanting
        for (w, outcome), prepared, reply in zip(committing, appends, replies):
            result = parse_append(reply)
            if result.status == "ok":
                outcomes[w.command.command_id] = outcome
                # Only an append that carried the answer acknowledged the entry: an approval request's does
                # not, and its command is answered with the others (else it waited for a reclaim).
                if prepared.answers:
                    acknowledged.add(w.entry[1])
            elif result.status == "dup":
                outcomes[w.command.command_id] = idempotency.replayed_outcome(result.record, w.command.arguments)
            else:
                retry.append(w)
        metrics.CONFLICT_ROUNDS.inc(len(retry))
        if on_held:
            self.held.contended(len(retry), len(committing))
        return retry

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
