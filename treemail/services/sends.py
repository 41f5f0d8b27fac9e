"""Deciding a batch of SendMessage commands: load, decide, append atomically, answer.

Commands of one batch are decided in order against an in-memory copy of each
session's state, so several sends to one recipient chain their expected etags
in one pipeline. A conflict (another writer appended first) sends the command
round again with freshly loaded state; nothing here is trusted across rounds,
so any number of workers may race.
"""

import time
from dataclasses import dataclass

from ..adapters import metrics
from ..adapters.eventstore import EventStore, Loaded, PreparedAppend, parse_append
from ..domain import ids
from ..domain.commands import SendMessage
from ..domain.decide import idempotency
from ..domain.decide.guards import Found, NoSuchHandle, NoSuchSession, Target
from ..domain.decide.send import Accepted, AwaitsApproval, Refused, SendDecision, SendGiven, outcome_of
from ..domain.handlers import HANDLERS
from ..domain.messaging import MessagingConfig
from ..domain.records import Peer, SessionRecord
from ..domain.state import SessionState
from . import admission

decide_send = HANDLERS[SendMessage].decide


@dataclass
class _Work:
    command: SendMessage
    sender: SessionRecord | None = None
    target: SessionRecord | NoSuchSession | NoSuchHandle | None = None


class SendService:
    def __init__(self, store: EventStore, config: MessagingConfig) -> None:
        self.store = store
        self.directory = store.directory
        self.config = config

    async def decide(self, commands: list[SendMessage]) -> dict[str, dict]:
        """Decide every command; returns command id -> outcome. Appends are durable on return."""
        outcomes: dict[str, dict] = {}
        work = [_Work(c) for c in commands]
        while work:
            work = await self._round(work, outcomes)
        return outcomes

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

    async def _peers(self, sender: SessionRecord) -> list[Peer]:
        members = await self.directory.tree_members(sender.partition, sender.root_session_id)
        records = await self.directory.many([m for m in members if m != sender.session_id])
        present = [r for r in records.values() if r is not None]
        states = await self.store.load_many(present)
        return [Peer(r, states[r.session_id].state.status) for r in present]

    async def _load(self, work: list[_Work]) -> tuple[dict[str, Loaded], dict[str, frozenset[str]], bool]:
        """Every sender's and recipient's state, the senders' tree grants, and whether the service drains.

        The idempotency record is not read here: the commit script checks it
        atomically and answers a duplicate with the recorded outcome.
        """
        records: dict[str, SessionRecord] = {}
        for w in work:
            if w.sender is not None:
                records[w.sender.session_id] = w.sender
            if isinstance(w.target, SessionRecord):
                records[w.target.session_id] = w.target
        loaded = await self.store.load_many(list(records.values()))
        grants = await self.directory.tree_grants([w.sender for w in work if w.sender is not None])
        return loaded, grants, await admission.service_draining(self.store)

    def _decide_one(
        self, w: _Work, loaded: dict[str, Loaded], grants: dict[str, frozenset[str]], draining: bool = False
    ) -> SendDecision:
        sender_state = loaded[w.sender.session_id].state if w.sender else SessionState()
        target: Target = w.target
        if isinstance(target, SessionRecord):
            target = Found(target, loaded[target.session_id].state)
        given = SendGiven(
            sender=w.sender, sender_state=sender_state, target=target, config=self.config,
            tree_grants=grants.get(w.sender.root_session_id, frozenset()) if w.sender else frozenset(),
            new_id=ids.uuid7(), now=time.time(), service_draining=draining,
        )
        return decide_send(w.command, given)

    async def _round(self, work: list[_Work], outcomes: dict[str, dict]) -> list[_Work]:
        await self._resolve(work)
        loaded, grants, draining = await self._load(work)
        committing: list[tuple[_Work, SendDecision]] = []
        appends: list[PreparedAppend] = []
        record_first: list[tuple[SendMessage, SessionRecord]] = []
        for w in work:
            decision = self._decide_one(w, loaded, grants, draining)
            prepared = self._prepare(w, decision, loaded)
            if prepared is None:
                outcomes[w.command.command_id] = outcome_of(decision)
                if isinstance(decision, Refused) and idempotency.answers_from_record_first(decision.code):
                    record_first.append((w.command, w.sender))
                continue
            appends.append(prepared)
            committing.append((w, decision))
        # Seed 002: a refusal because time moved on must not hide what this tool call got before.
        await admission.answer_from_records(self.store, record_first, outcomes)
        if not committing:
            return []

        def build(pipe) -> None:
            for prepared in appends:
                self.store.commit_call(prepared, pipe)

        replies = await self.store.run_pipeline(build)
        retry: list[_Work] = []
        for (w, decision), reply in zip(committing, replies):
            result = parse_append(reply)
            if result.status == "ok":
                outcomes[w.command.command_id] = outcome_of(decision)
            elif result.status == "dup":
                outcomes[w.command.command_id] = idempotency.replayed_outcome(result.record, w.command.arguments)
            else:
                retry.append(w)
        metrics.CONFLICT_ROUNDS.inc(len(retry))
        return retry

    def _prepare(self, w: _Work, decision: SendDecision, loaded: dict[str, Loaded]) -> PreparedAppend | None:
        """The append a decision needs, chained on the state earlier commands of the batch left; None if none."""
        match decision:
            case AwaitsApproval(events=[]) | Refused(recorded=False):
                return None
            case AwaitsApproval(events=events):
                # The request goes on the sender's stream, atomically: either whole or not at all.
                session, digest, record = w.sender, None, None
            case Accepted() | Refused():
                events = decision.events if isinstance(decision, Accepted) else []
                session = w.target
                digest = idempotency.key_digest(w.command.context)
                record = idempotency.record(w.command.arguments, outcome_of(decision))
        prepared = self.store.prepare(
            session, loaded[session.session_id], events, idempotency_digest=digest, idempotency_record=record
        )
        loaded[session.session_id] = prepared.loaded
        return prepared
