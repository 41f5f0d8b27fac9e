"""The host API: what an agent engine embeds (async).

    tm = await Treemail.connect()
    root = await tm.register_root("planner", "plans the work", rules={"child": "allow"})
    child = await tm.register_child(root.session_id, "explore", "reads the code", rules={"parent": "allow"})
    result = await tm.send_message(SendContext(root.session_id, run_id, tool_call_id), {"to": child.handle, "body": "hi"})

``send_message`` never raises for anything a model can cause: it returns the
success result or ``{"error": {"code": ..., "message": ...}}``.
"""

import asyncio
import time
from dataclasses import dataclass

import redis.asyncio as aioredis

from consumers import sessions
from consumers.approvals import ApprovalStore
from consumers.eventstore import EventStore
from producers import send_message as tool
from producers.client import CommandClient

from . import ids, keys
from .config import Config, load_config
from .connection import connect
from .errors import Code, Rejected
from .mail import decider as d
from .mail import events as ev
from .mail.commands import SendContext
from .mail.state import MailItem

__all__ = ["Treemail", "SendContext", "Registration"]


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

    async def claim(self, session_id: str, run_id: str) -> list[ev.ProducerMessageClaimed]:
        """Mark the mail due at this safe boundary as claimed by the run; returns the claims in order."""
        claimed = await self.sessions.execute(
            session_id, lambda s, m: d.decide_claim(s, m, run_id, time.time())
        )
        return [e for e in claimed if isinstance(e, ev.ProducerMessageClaimed)]

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
