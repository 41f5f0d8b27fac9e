"""The host API: what an agent engine embeds (async).

    tm = await Treemail.connect()
    root = await tm.register_root("planner", "plans the work", rules={"child": "allow"})
    child = await tm.register_child(root.session_id, "explore", "reads the code", rules={"parent": "allow"})
    result = await tm.send_message(SendContext(root.session_id, run_id, tool_call_id), {"to": child.handle, "body": "hi"})

``send_message`` never raises for anything a model can cause: it returns the
success result or ``{"error": {"code": ..., "message": ...}}``.
"""

import asyncio
import json
import time
from dataclasses import dataclass

import redis.asyncio as aioredis

from consumers import sessions
from consumers.approvals import ApprovalStore
from consumers.eventstore import EventStore
from producers import send_message as tool
from producers.client import CommandClient

from . import envelope, ids, keys
from .config import Config, load_config
from .connection import connect
from .errors import LifecycleError, Rejected
from .mail import decider as d
from .mail import events as ev
from .mail.commands import SendContext
from .mail.state import MailItem

def _text(value) -> str:
    return value.decode() if isinstance(value, bytes) else value


__all__ = ["Treemail", "SendContext", "Registration", "Delivery", "Wake"]


@dataclass(frozen=True)
class Delivery:
    """One claimed message, rendered for the recipient's prompt."""

    message_id: str
    owner: str
    mode: str
    sender_session_id: str | None
    text: str


@dataclass(frozen=True)
class Wake:
    """A wake trigger: start a run on this session with its due mail as input, then ack."""

    session_id: str
    message_id: str | None
    stream: str
    entry_id: str


@dataclass(frozen=True)
class Registration:
    session_id: str
    handle: str
    root_session_id: str


class Treemail:
    def __init__(self, redis: aioredis.Redis, listener: aioredis.Redis, config: Config) -> None:
        self.config = config
        self.redis = redis
        self.store = EventStore(redis, config.service)
        self.sessions = sessions.SessionService(self.store, config)
        self.approvals = ApprovalStore(self.store)
        self.commands = CommandClient(redis, listener, config.service)
        self._listener = listener
        self._last_wake_reclaim = 0.0

    @classmethod
    async def connect(cls, config: Config | None = None, url: str | None = None) -> "Treemail":
        config = config or load_config()
        url = url or config.service.redis_url
        if not url:
            raise ValueError("no Redis URL: set REDIS_URL or [service] redis_url")
        redis = await connect(url, config.service)
        listener = await connect(url, config.service)
        host = cls(redis, listener, config)
        await host.store.ensure_command_group(config.service.command_streams)
        await host.store.ensure_wake_groups(config.service.partitions)
        return host

    async def close(self) -> None:
        """Pending sends are answered send_message:engine_shutdown; nothing accepted is lost."""
        await self.commands.close()
        await self._listener.aclose()
        await self.redis.aclose()

    async def __aenter__(self) -> "Treemail":
        return self

    async def __aexit__(self, *exc) -> None:
        await self.close()

    # ---- registration and status ---------------------------------------------------------------

    async def register_root(
        self, agent_type: str, description: str = "", *, rules=None, send_message_tool: bool = True,
        status: str = "running",
    ) -> Registration:
        return await self._register(agent_type, description, rules, send_message_tool, status, None)

    async def register_child(
        self, parent_session_id: str, agent_type: str, description: str = "", *, rules=None,
        send_message_tool: bool = True, status: str = "queued",
    ) -> Registration:
        return await self._register(agent_type, description, rules, send_message_tool, status, parent_session_id)

    async def _register(self, agent_type, description, rules, send_message_tool, status, parent) -> Registration:
        record = await self.sessions.register(
            agent_type=agent_type, description=description, rules=rules,
            send_message_tool=send_message_tool, status=status, parent_session_id=parent,
        )
        return Registration(record.session_id, record.handle, record.root_session_id)

    async def set_status(self, session_id: str, status: str) -> None:
        if status not in ("queued", "running", "idle", "finished"):
            raise ValueError(f"status must be queued, running, idle or finished, got {status!r}")
        await self.sessions.execute(session_id, lambda s, m: d.decide_status(s, status, time.time()), with_mail=False)

    # ---- delivery lifecycle ----------------------------------------------------------------------

    async def consume(self, session_id: str, message_id: str) -> None:
        """The model request that carried this claimed message succeeded."""
        await self.sessions.execute(session_id, lambda s, m: d.decide_consume(s, m, message_id, time.time()))

    async def release(self, session_id: str, message_id: str) -> None:
        """The model request failed: the message is due again and still counts as pending."""
        await self.sessions.execute(session_id, lambda s, m: d.decide_release(s, m, message_id, time.time()))

    async def discard(self, session_id: str, message_id: str, reason: str = "") -> None:
        await self.sessions.execute(
            session_id, lambda s, m: d.decide_discard(s, m, message_id, reason, time.time())
        )

    async def start_run(self, session_id: str, run_id: str) -> None:
        await self.sessions.execute(session_id, lambda s, m: d.decide_start_run(s, m, run_id, time.time()))

    async def finish_run(self, session_id: str, run_id: str) -> None:
        await self.sessions.execute(session_id, lambda s, m: d.decide_finish_run(s, m, run_id, time.time()))

    async def claim(self, session_id: str, run_id: str) -> list[Delivery]:
        """At a safe model-request boundary: the mail due in this run, claimed by it, in acceptance order."""
        seen: dict[str, MailItem] = {}

        def decide(state, mail):
            seen.clear()
            seen.update(mail)
            return d.decide_claim(state, mail, run_id, time.time())

        claimed = await self.sessions.execute(session_id, decide)
        if not claimed:
            return []
        record = await self.sessions.record(session_id)
        accepted = await self.store.read_at(record, [seen[e.message_id].seq for e in claimed])
        reply_hint = tool.tool_definition(record.rules, record.send_message_tool) is not None
        return [self._deliver(accepted[seen[e.message_id].seq], reply_hint) for e in claimed]

    @staticmethod
    def _deliver(event: ev.ProducerMessageAccepted, reply_hint: bool) -> Delivery:
        if event.owner == "agent":
            sender = event.sender_handle or event.sender_session_id
            text = envelope.render_agent_message(sender, event.body, reply_hint)
        else:
            text = event.body
        return Delivery(event.message_id, event.owner, event.mode, event.sender_session_id, text)

    # ---- wake and reconcile --------------------------------------------------------------------------

    async def wakes(self, consumer: str, count: int = 10, block_ms: int = 1000) -> list[Wake]:
        """Wake triggers for this host runner (one consumer group shared by all runners).

        Triggers another runner read but never acknowledged (it died) are
        reclaimed once they have been idle for ``reclaim_idle_ms``.
        """
        reclaimed = await self._reclaim_wakes(consumer, count)
        if reclaimed:
            return reclaimed
        streams = [keys.wake_stream(p) for p in range(self.config.service.partitions)]
        if self.config.service.cluster:
            # One stream per read: the partitions' streams live in different slots.
            replies = [r for reply in await asyncio.gather(*(
                self.redis.xreadgroup(keys.WAKE_GROUP, consumer, {s: ">"}, count=count, block=block_ms)
                for s in streams
            )) for r in reply or []]
        else:
            replies = await self.redis.xreadgroup(
                keys.WAKE_GROUP, consumer, {s: ">" for s in streams}, count=count, block=block_ms
            )
        return [self._wake(stream, entry_id, fields) for stream, entries in replies or [] for entry_id, fields in entries]

    async def _reclaim_wakes(self, consumer: str, count: int) -> list[Wake]:
        now = time.monotonic()
        if now - self._last_wake_reclaim < self.config.service.reclaim_idle_ms / 1000:
            return []
        self._last_wake_reclaim = now
        out = []
        for p in range(self.config.service.partitions):
            stream = keys.wake_stream(p)
            _, entries, *_ = await self.redis.xautoclaim(
                stream, keys.WAKE_GROUP, consumer, self.config.service.reclaim_idle_ms, count=count
            )
            out.extend(self._wake(stream, entry_id, fields) for entry_id, fields in entries if fields)
        return out

    @staticmethod
    def _wake(stream, entry_id, fields) -> Wake:
        data = json.loads(fields[b"data"])
        return Wake(data["session_id"], data.get("message_id"), _text(stream), _text(entry_id))

    async def wake_run(self, wake: Wake, run_id: str) -> bool:
        """Start the woken run (its due mail is admitted into it) and acknowledge the trigger.

        Returns False when the session is already running: its mail reaches
        the current run at the next boundary, so the trigger is simply acknowledged.
        """
        try:
            await self.start_run(wake.session_id, run_id)
            started = True
        except LifecycleError as error:
            if error.code != "lifecycle:run_active":
                raise
            started = False
        await self.redis.xack(wake.stream, keys.WAKE_GROUP, wake.entry_id)
        return started

    async def reconcile(self, interrupted_runs: bool = False) -> int:
        """After a restart: make sure every session with mail due will be delivered to.

        With ``interrupted_runs`` (the host restarted, so no run survived),
        runs still open in the streams are finished, which releases the mail
        they had claimed, and their sessions become idle. Then every idle or
        finished session with pending mail gets a wake trigger. Returns the
        number of triggers written; a duplicate trigger is harmless.
        """
        written = 0
        for p in range(self.config.service.partitions):
            for raw in await self.redis.smembers(keys.partition_sessions(p)):
                session_id = _text(raw)
                record = await self.sessions.record(session_id)
                loaded = await self.store.load(record)
                if interrupted_runs and loaded.state.current_run is not None:
                    await self.finish_run(session_id, loaded.state.current_run)
                    await self.set_status(session_id, "idle")
                    loaded = await self.store.load(record)
                state = loaded.state
                if state.status in ("idle", "finished") and state.current_run is None and state.pending_all > 0:
                    await self.store.add_wake(record, loaded.version)
                    written += 1
        return written

    async def pending_mail(self, session_id: str) -> list[MailItem]:
        record = await self.sessions.record(session_id)
        return sorted((await self.store.load_mail(record)).values(), key=lambda m: m.seq)

    async def inject(self, session_id: str, owner: str, body: str, mode: str = "queue") -> str:
        """Mail from a plugin, a delegation notification or a goal: never counted by the agent guards."""
        if owner not in ("plugin", "delegation", "goal"):
            raise ValueError(f"owner must be plugin, delegation or goal, got {owner!r}")
        if mode not in ("steer", "queue"):
            raise ValueError(f"mode must be steer or queue, got {mode!r}")
        message_id = ids.uuid7()

        def decide(state, mail):
            try:
                return d.decide_inject(state, owner, body, mode, self.config.messaging, message_id=message_id,
                                       now=time.time())
            except Rejected as rejection:
                raise ValueError(rejection.message) from None

        await self.sessions.execute(session_id, decide, with_mail=False)
        return message_id

    # ---- the model-facing tool -------------------------------------------------------------------

    async def tool_definition(self, session_id: str) -> dict | None:
        record = await self.sessions.record(session_id)
        return tool.tool_definition(record.rules, record.send_message_tool)

    async def send_message(self, context: SendContext, arguments) -> dict:
        try:
            parsed = tool.parse_arguments(arguments)
        except Rejected as rejection:
            return tool.error_result(rejection.code.value, rejection.message)
        while True:
            outcome = await self.commands.request(context, parsed)
            if "approval" not in outcome:
                break
            # An `ask` rule: the send completes when a person approves, or fails when they deny.
            resolved = await self._wait_for_approval(outcome["approval"]["request_id"])
            if not resolved:
                return tool.engine_shutdown("the engine is shutting down while the send awaits approval")
        if "ok" in outcome:
            return outcome["ok"]
        return outcome

    async def _wait_for_approval(self, request_id: str) -> bool:
        while not self.commands.closing:
            request = await self.approvals.get(request_id)
            if request["status"] != "pending":
                return True
            await self.redis.blpop([keys.approval_notify(request_id)], timeout=1)
        return False

    # ---- approvals ---------------------------------------------------------------------------------

    async def pending_approvals(self) -> list[dict]:
        return await self.approvals.pending()

    async def approve(self, request_id: str, scope: str = "once") -> dict:
        if scope not in ("once", "tree"):
            raise ValueError(f"scope must be once or tree, got {scope!r}")
        return await self.approvals.resolve(request_id, "approve_tree" if scope == "tree" else "approve_once")

    async def deny(self, request_id: str) -> dict:
        return await self.approvals.resolve(request_id, "deny")

    # ---- history -------------------------------------------------------------------------------------

    async def history(self, session_id: str) -> list[tuple[int, ev.Event]]:
        record = await self.sessions.record(session_id)
        return await self.store.read(record)
