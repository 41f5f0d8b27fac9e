"""The session service: load, decide with the command table, append with the expected etag, retry.

Every command on one session except the send (which the worker pool decides
in batches, ``services.sends``) goes through ``execute``: registration,
status, runs, claims, acknowledgements, injected mail, wakes, approvals.
"""

import logging
from dataclasses import fields, replace
from typing import NamedTuple

from redis.exceptions import RedisError

from ..adapters import keys
from ..adapters.config import Config
from ..adapters.eventstore import EventStore
from ..adapters.peerdue import PeerDue
from ..domain import events as ev
from ..domain import actions, ids, limits, outbound
from ..domain.commands import STATUSES, ForkSession, RegisterSession, SessionCommand
from ..domain.commitplan import plan_commit
from ..domain.decide.lifecycle import Given, require_parent_unsealed
from ..domain.errors import LifecycleError, RedisUnavailable, TreemailError, UnknownSessionError
from ..domain.handlers import HANDLERS, decide_command
from ..domain.records import SessionRecord
from .clock import SYSTEM_CLOCK, Clock
from .outbound import load_senders
from .transaction import HandleTaken, Write, transact

HANDLE_ATTEMPTS = 16

log = logging.getLogger("treemail.sessions")


class SessionService:
    def __init__(self, store: EventStore, config: Config, clock: Clock = SYSTEM_CLOCK) -> None:
        self.store = store
        self.config = config
        self.clock = clock

    async def record(self, session_id: str) -> SessionRecord:
        limits.require_id("session_id", session_id)  # never looked up (nor echoed) whatever its size
        record = await self.store.directory.get(session_id)
        if record is None:
            raise UnknownSessionError(f"no session has id {session_id}")
        return record

    async def execute(self, command: SessionCommand, record: SessionRecord | None = None, *,
                      refresh_index: bool = False) -> list[ev.Event]:
        """Decide ``command`` on fresh state and append; on a conflict decide again on newer state.

        ``refresh_index`` (the delivery pump): append even when nothing is to
        be done, which rewrites the session's entry in the due index exactly,
        under the same etag check as any append.
        """
        handler = HANDLERS[type(command)]
        # Before anything is read or stored: no caller can grow a stream with an unbounded identifier.
        limits.check_command(command)
        record = record or await self.record(command.session_id)

        async def round_(_attempt: int) -> Write:
            loaded = await self.store.load(record)
            if not loaded.state.registered and not isinstance(command, (RegisterSession, ForkSession)):
                raise LifecycleError("lifecycle:unknown_session", f"session {command.session_id} is not registered")
            mail = await self.store.load_mail(record, handler.reads_mail, getattr(command, "message_id", None))
            history = await self._history(handler, command, record, loaded.version)
            wanted = handler.reads_senders(command, mail, history) if handler.reads_senders else ()
            senders, held = await load_senders(self.store, record, wanted)
            now = self.clock.now()
            decision = decide_command(command, Given(
                loaded.state, mail, self.config.messaging, now, history,
                session_id=record.session_id, version=loaded.version, senders=senders,
            ))
            if not decision.events and not refresh_index:
                return Write(Decided([], None))
            plan = plan_commit(
                record, loaded.state, loaded.version, decision.events, mail=mail,
                mail_complete=handler.reads_mail == "all", policy=self.config.messaging, now=now,
                sources=decision.sources,
            )
            return Write(Decided(decision.events, mail), plan, loaded, held)

        decided = await transact(self.store, command.session_id, round_)
        if decided.mail is not None:
            await self._peer_settlements_due(decided.mail, decided.events)
        return decided.events

    async def _peer_settlements_due(self, mail, events: list[ev.Event]) -> None:
        """Peer mail consumed or discarded here is settled by its source's driver: the source is due now, not
        at the driver's next scheduled look (up to a minute away). Only a hint: if this write fails, that look
        still finds it."""
        sources = outbound.settled_peer_sources(mail, events)
        if not sources:
            return
        now, due = self.clock.now(), PeerDue(self.store.redis)
        try:
            for record in (await self.store.directory.many(sorted(sources))).values():
                if record is not None:
                    await due.touch(record, now)
        except RedisError as error:
            log.info("peer settlement left to the driver's schedule: %s", type(error).__name__)

    async def _history(self, handler, command, record: SessionRecord, version: int) -> tuple:
        if handler.reads_history is None:
            return ()
        session_id = handler.reads_history(command)
        if session_id != record.session_id:
            return tuple(await self.store.read(await self.record(session_id)))
        # Exactly the events the loaded state folds; any appended since make this append conflict anyway.
        return tuple((seq, e) for seq, e in await self.store.read(record) if seq <= version)

    async def register(
        self,
        *,
        agent_type: str,
        description: str,
        rules,
        send_message_tool: bool,
        status: str,
        parent_session_id: str | None,
        with_handle: bool = True,
        resident: bool = True,
        continuable: bool = True,
        accepts_images: bool = False,
        announced: bool = False,
    ) -> SessionRecord:
        normalized, interrupt_rules = actions.split_actions(rules)
        session_id = ids.uuid7()
        root_id = session_id if parent_session_id is None else (await self.record(parent_session_id)).root_session_id
        origin = RegisterSession(
            session_id=session_id, root_session_id=root_id, parent_session_id=parent_session_id,
            agent_type=agent_type, description=description, handle=None, rules=normalized,
            send_message_tool=send_message_tool, status=status, resident=resident, continuable=continuable,
            accepts_images=accepts_images, interrupt_rules=interrupt_rules, announced=announced,
        )
        return await self._register(origin, with_handle, lambda registration: registration)

    async def fork(
        self, source_session_id: str, at_position: int, *, description: str | None = None, status: str = "idle"
    ) -> SessionRecord:
        """A new session of the source's tree, with its origin, starting from its history at ``at_position``."""
        source = await self.record(source_session_id)
        # Every origin field the record keeps is the source's (tree, parent, type, rules, ...), new ones included.
        origin = RegisterSession(**{
            **{name: getattr(source, name) for name in _ORIGIN_FIELDS}, "session_id": ids.uuid7(), "handle": None,
            "description": source.description if description is None else description, "status": status,
        })
        return await self._register(
            origin, True, lambda registration: ForkSession(registration, source_session_id, at_position)
        )

    async def _register(self, origin: RegisterSession, with_handle: bool, command_for) -> SessionRecord:
        if origin.status not in STATUSES:
            raise limits.IdentifierError(limits.INVALID, "status must be queued, running, idle or finished")
        limits.check_command(origin)  # before the directory entry: a refused registration stores nothing
        partition = keys.partition_of(origin.root_session_id, self.config.service.partitions)
        if origin.parent_session_id is not None:
            # Refused before the directory entry too; the registration's own step checks it again, atomically.
            parent = await self.record(origin.parent_session_id)
            require_parent_unsealed(parent.session_id, (await self.store.load(parent)).state)
        # A session without a handle cannot collide with another: one attempt.
        for _ in range(HANDLE_ATTEMPTS if with_handle else 1):
            registration = replace(origin, handle=ids.new_handle(origin.agent_type) if with_handle else None)
            record = SessionRecord(
                **{name: getattr(registration, name) for name in _ORIGIN_FIELDS}, partition=partition
            )
            # The directory entry comes first: a handle that resolves must always find its record.
            await self.store.directory.put(record)
            try:
                await self.execute(command_for(registration), record)
            except HandleTaken:
                continue
            except RedisUnavailable:
                raise  # the outcome is unknown: a registration that landed must keep its entry
            except (TreemailError, ValueError, TypeError):
                # Decided against before anything was appended (a parent a stop sealed since the check above, a
                # fork position outside the source's history, a field its event refuses): the session was never
                # registered, so its directory entry goes too. (An outcome the server left unknown keeps it.)
                await self.store.directory.withdraw(record.session_id)
                raise
            return record
        raise LifecycleError("lifecycle:contention", f"no free handle for agent type {origin.agent_type!r} after "
                                                     f"{HANDLE_ATTEMPTS} attempts")


# What a registration and the directory record both hold: the record is the registration's origin.
_ORIGIN_FIELDS = tuple(
    f.name for f in fields(SessionRecord) if f.name in {g.name for g in fields(RegisterSession)}
)


class Decided(NamedTuple):
    """A command's events as appended, and the pending mail it was decided with (None: nothing appended)."""

    events: list[ev.Event]
    mail: dict | None
