"""The session service: load, decide with the command table, append with the expected etag, retry.

Every command on one session except the send (which the worker pool decides
in batches, ``services.sends``) goes through ``execute``: registration,
status, runs, claims, acknowledgements, injected mail, wakes, approvals.
"""

import asyncio
import random
import time

from ..adapters import keys
from ..adapters.config import Config
from ..adapters.eventstore import EventStore
from ..domain import events as ev
from ..domain import ids, permissions
from ..domain.commands import STATUSES, RegisterSession, SessionCommand
from ..domain.decide.lifecycle import Given
from ..domain.errors import LifecycleError, UnknownSessionError
from ..domain.handlers import HANDLERS
from ..domain.records import SessionRecord

HANDLE_ATTEMPTS = 16
# Writers racing on one session retry with jitter; past this many conflicts in
# a row something is wrong (a writer looping), and the caller is told.
CONFLICT_ATTEMPTS = 200


class SessionService:
    def __init__(self, store: EventStore, config: Config) -> None:
        self.store = store
        self.config = config

    async def record(self, session_id: str) -> SessionRecord:
        record = await self.store.directory.get(session_id)
        if record is None:
            raise UnknownSessionError(f"no session has id {session_id}")
        return record

    async def execute(self, command: SessionCommand, record: SessionRecord | None = None) -> list[ev.Event]:
        """Decide ``command`` on fresh state and append; on a conflict decide again on newer state."""
        handler = HANDLERS[type(command)]
        record = record or await self.record(command.session_id)
        for attempt in range(CONFLICT_ATTEMPTS):
            if attempt:
                # Many writers on one session: spread the retries so they stop colliding in lockstep.
                await asyncio.sleep(random.uniform(0, 0.001 * min(attempt, 20)))
            loaded = await self.store.load(record)
            if not loaded.state.registered and not isinstance(command, RegisterSession):
                raise LifecycleError("lifecycle:unknown_session", f"session {command.session_id} is not registered")
            mail = await self.store.load_mail(record) if handler.reads_mail else {}
            new_events = handler.decide(command, Given(loaded.state, mail, self.config.messaging, time.time()))
            if not new_events:
                return []
            result = await self.store.append(self.store.prepare(record, loaded, new_events, mail=mail))
            if result.status == "ok":
                return new_events
            if result.status == "handle_taken":
                raise HandleTaken(record.handle)
        raise LifecycleError(
            "lifecycle:contention", f"session {command.session_id} kept changing under {CONFLICT_ATTEMPTS} attempts"
        )

    async def register(
        self,
        *,
        agent_type: str,
        description: str,
        rules,
        send_message_tool: bool,
        status: str,
        parent_session_id: str | None,
        continuable: bool = True,
    ) -> SessionRecord:
        if status not in STATUSES:
            raise ValueError(f"status must be queued, running, idle or finished, got {status!r}")
        normalized = permissions.normalize_rules(rules)
        session_id = ids.uuid7()
        root_id = session_id if parent_session_id is None else (await self.record(parent_session_id)).root_session_id
        partition = keys.partition_of(root_id, self.config.service.partitions)
        for _ in range(HANDLE_ATTEMPTS):
            command = RegisterSession(
                session_id=session_id, root_session_id=root_id, parent_session_id=parent_session_id,
                agent_type=agent_type, description=description, handle=ids.new_handle(agent_type),
                rules=normalized, send_message_tool=send_message_tool, status=status, continuable=continuable,
            )
            record = SessionRecord(
                session_id=session_id, root_session_id=root_id, parent_session_id=parent_session_id,
                agent_type=agent_type, description=description, handle=command.handle, rules=normalized,
                send_message_tool=send_message_tool, partition=partition,
            )
            # The directory entry comes first: a handle that resolves must always find its record.
            await self.store.directory.put(record)
            try:
                await self.execute(command, record)
            except HandleTaken:
                continue
            return record
        raise RuntimeError(f"no free handle for agent type {agent_type!r} after {HANDLE_ATTEMPTS} attempts")


class HandleTaken(Exception):
    """Another session of the tree holds this handle: registration draws another."""
