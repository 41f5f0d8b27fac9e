"""Deciding a batch of SendMessage commands: load, decide, append atomically, answer.

Commands of one batch are decided in order against an in-memory copy of each
recipient's state, so several sends to one recipient chain their expected
versions in one pipeline. A version conflict (another worker appended first)
sends the command round again with freshly loaded state; nothing here is
trusted across rounds, so any number of workers may race.
"""

import json
import time
from dataclasses import dataclass

from treemail import ids, metrics
from treemail.config import MessagingConfig
from treemail.mail import decider as d
from treemail.mail.commands import SendArguments, SendContext, SendMessage
from treemail.mail.state import SessionState

from .approvals import ApprovalStore
from .eventstore import EventStore, Loaded, parse_append



def parse_command(fields: dict) -> SendMessage:
    data = json.loads(fields)
    sid, run, call = data["ctx"]
    to, body, mode = data["args"]
    return SendMessage(data["id"], SendContext(sid, run, call), SendArguments(to, body, mode), data["reply_to"])


def encode_command(command: SendMessage) -> str:
    c, a = command.context, command.arguments
    return json.dumps(
        {
            "id": command.command_id,
            "ctx": [c.session_id, c.run_id, c.tool_call_id],
            "args": [a.to, a.body, a.mode],
            "reply_to": command.reply_to,
        },
        separators=(",", ":"),
    )


@dataclass
class _Work:
    command: SendMessage
    sender: d.SessionRecord | None = None
    target: d.Target | None = None
    digest: str = ""


class SendDecider:
    def __init__(self, store: EventStore, approvals: ApprovalStore, config: MessagingConfig) -> None:
        self.store = store
        self.approvals = approvals
        self.config = config

    async def decide(self, commands: list[SendMessage]) -> dict[str, dict]:
        """Decide every command; returns command id -> outcome. Appends are durable on return."""
        outcomes: dict[str, dict] = {}
        work = [_Work(c, digest=d.idempotency_digest(c.context)) for c in commands]
        while work:
            work = await self._round(work, outcomes)
        return outcomes

    async def _resolve(self, work: list[_Work]) -> None:
        """Sender and recipient records; handles are looked up in the sender's tree only."""
        senders = await self.store.directory_many([w.command.context.session_id for w in work])
        for w in work:
            w.sender = senders[w.command.context.session_id]
        by_uuid = await self.store.directory_many(
            [w.command.arguments.to.lower() for w in work if ids.is_uuid(w.command.arguments.to)]
        )
        handles = await self.store.handle_owners(
            [(w.sender.partition, w.sender.root_session_id, w.command.arguments.to) for w in work
             if w.sender is not None and ids.HANDLE_PATTERN.match(w.command.arguments.to)]
        )
        by_handle = await self.store.directory_many([sid for sid in handles.values() if sid is not None])
        for w in work:
            to = w.command.arguments.to
            if ids.is_uuid(to):
                w.target = by_uuid[to.lower()] or d.NoSuchSession(to)
                continue
            owner = handles.get((w.sender.partition, w.sender.root_session_id, to)) if w.sender else None
            w.target = (by_handle[owner] if owner else None) or d.NoSuchHandle(to)
            if isinstance(w.target, d.NoSuchHandle) and w.sender is not None:
                # The error repairs itself: it lists who the sender can address.
                w.target = d.NoSuchHandle(to, await self._peers(w.sender))

    async def _load(self, work: list[_Work]) -> dict[str, Loaded]:
        """Every sender's and recipient's state in one round trip.

        The idempotency record is not read here: the commit script checks it
        atomically and answers a duplicate with the recorded outcome.
        """
        records: dict[str, d.SessionRecord] = {}
        for w in work:
            if w.sender is not None:
                records[w.sender.session_id] = w.sender
            if isinstance(w.target, d.SessionRecord):
                records[w.target.session_id] = w.target
        async with self.store.redis.pipeline(transaction=False) as pipe:
            for record in records.values():
                pipe.hmget(self.store.state_key(record), *self.store.STATE_FIELDS)
            replies = await pipe.execute()
        return {sid: self.store.parse_loaded(r) for sid, r in zip(records, replies)}

    async def _peers(self, sender: d.SessionRecord) -> list[d.Peer]:
        members = await self.store.tree_members(sender.partition, sender.root_session_id)
        records = await self.store.directory_many([m for m in members if m != sender.session_id])
        present = [r for r in records.values() if r is not None]
        states = [await self.store.load(r) for r in present]
        return [d.Peer(r, s.state.status) for r, s in zip(present, states)]

    def _decide_one(self, w: _Work, loaded: dict[str, Loaded], approval: d.Approval) -> d.Decision:
        c = w.command
        sender_state = loaded[w.sender.session_id].state if w.sender else SessionState()
        target = w.target
        if isinstance(target, d.SessionRecord):
            target = d.Found(target, loaded[target.session_id].state)
        return d.decide_send(
            c.context,
            c.arguments,
            w.sender,
            sender_state,
            target,
            self.config,
            approval=approval,
            message_id=ids.uuid7(),
            now=time.time(),
        )

    async def _round(self, work: list[_Work], outcomes: dict[str, dict]) -> list[_Work]:
        await self._resolve(work)
        loaded = await self._load(work)
        committing: list[tuple[_Work, d.Accepted | d.Refused]] = []
        prepared_appends = []
        for w in work:
            decision = self._decide_one(w, loaded, d.Approval())
            if isinstance(decision, d.NeedsApproval):
                approval = await self.approvals.status_for(w.sender, w.digest, decision.label)
                decision = self._decide_one(w, loaded, approval)
                if isinstance(decision, d.NeedsApproval):
                    outcomes[w.command.command_id] = await self.approvals.request(w.command, w.sender, w.target, decision.label, w.digest)
                    continue
            match decision:
                case d.Replayed() | d.Refused(recorded=False):
                    outcomes[w.command.command_id] = d.outcome_of(decision)
                case d.Refused() | d.Accepted():
                    recipient = w.target
                    events = decision.events if isinstance(decision, d.Accepted) else []
                    record = {"fp": d.fingerprint(w.command.arguments), "outcome": d.outcome_of(decision)}
                    prepared = self.store.prepare(
                        recipient,
                        loaded[recipient.session_id],
                        events,
                        idempotency_digest=w.digest,
                        idempotency_record=record,
                    )
                    prepared_appends.append(prepared)
                    loaded[recipient.session_id] = prepared.loaded
                    committing.append((w, decision))
        if not committing:
            return []

        def build(pipe) -> None:
            for prepared in prepared_appends:
                self.store.commit_call(prepared, pipe)

        replies = await self.store.run_pipeline(build)
        retry: list[_Work] = []
        for (w, decision), reply in zip(committing, replies):
            result = parse_append(reply)
            if result.status == "ok":
                outcomes[w.command.command_id] = d.outcome_of(decision)
            elif result.status == "dup":
                outcomes[w.command.command_id] = d.outcome_of(d.replay(result.record, w.command.arguments))
            else:
                retry.append(w)
        metrics.CONFLICT_ROUNDS.inc(len(retry))
        return retry
