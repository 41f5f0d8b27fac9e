"""Host-side commands on one session: load, decide, append with expected version, retry on conflict.

Registration, status and run changes, claims, acknowledgements and injected
mail are decided here, in the host's process, with the same pure decider and
the same atomic append as sends; only sends travel through the worker pool.
"""

import asyncio
import itertools
import random
import time
from collections.abc import Callable

from treemail import ids, keys, permissions
from treemail.config import Config
from treemail.errors import LifecycleError, UnknownSessionError
from treemail.mail import events as ev
from treemail.mail.decider import SessionRecord
from treemail.mail.state import MailItem, SessionState

from .eventstore import EventStore

HANDLE_ATTEMPTS = 16
Decide = Callable[[SessionState, dict[str, MailItem]], list[ev.Event]]


class SessionService:
    def __init__(self, store: EventStore, config: Config) -> None:
        self.store = store
        self.config = config

    async def register(
        self,
        *,
        agent_type: str,
        description: str,
        rules,
        send_message_tool: bool,
        status: str,
        parent_session_id: str | None,
    ) -> SessionRecord:
        if status not in ("queued", "running", "idle", "finished"):
            raise ValueError(f"status must be queued, running, idle or finished, got {status!r}")
        normalized = permissions.normalize_rules(rules)
        session_id = ids.uuid7()
        if parent_session_id is None:
            root_id = session_id
        else:
            parent = await self.record(parent_session_id)
            root_id = parent.root_session_id
        partition = keys.partition_of(root_id, self.config.service.partitions)
        for _ in range(HANDLE_ATTEMPTS):
            record = SessionRecord(
                session_id=session_id,
                root_session_id=root_id,
                parent_session_id=parent_session_id,
                agent_type=agent_type,
                description=description,
                handle=ids.new_handle(agent_type),
                rules=normalized,
                send_message_tool=send_message_tool,
                partition=partition,
            )
            registered = ev.SessionRegistered(
                at=time.time(),
                session_id=session_id,
                root_session_id=root_id,
                parent_session_id=parent_session_id,
                agent_type=agent_type,
                description=description,
                handle=record.handle,
                rules=normalized,
                send_message_tool=send_message_tool,
                status=status,
            )
            # The directory entry comes first: a handle that resolves must always find its record.
            await self.store.put_directory(record)
            loaded = await self.store.load(record)
            result = await self.store.append(self.store.prepare(record, loaded, [registered], reserve_handle=True))
            if result.status == "ok":
                return record
            if result.status != "handle_taken":
                raise RuntimeError(f"registration of {session_id} failed: {result.status}")
        raise RuntimeError(f"no free handle for agent type {agent_type!r} after {HANDLE_ATTEMPTS} attempts")

    async def record(self, session_id: str) -> SessionRecord:
        record = await self.store.directory(session_id)
        if record is None:
            raise UnknownSessionError(f"no session has id {session_id}")
        return record

    async def execute(self, session_id: str, decide: Decide, *, with_mail: bool = True) -> list[ev.Event]:
        """Decide on fresh state and append; on a version conflict decide again on newer state."""
        record = await self.record(session_id)
        for attempt in itertools.count():
            if attempt:
                # Many writers on one session: spread the retries so they stop colliding in lockstep.
                await asyncio.sleep(random.uniform(0, 0.001 * min(attempt, 20)))
            loaded = await self.store.load(record)
            if not loaded.state.registered:
                raise LifecycleError("lifecycle:unknown_session", f"session {session_id} is not registered")
            mail = await self.store.load_mail(record) if with_mail else {}
            new_events = decide(loaded.state, mail)
            if not new_events:
                return []
            result = await self.store.append(self.store.prepare(record, loaded, new_events, mail=mail))
            if result.status == "ok":
                return new_events
        raise AssertionError("unreachable")
