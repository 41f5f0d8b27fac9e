"""The host API: what an agent engine embeds (async).

    tm = await Treemail.connect()
    root = await tm.register_root("planner", "plans the work", rules={"child": "allow"})
    child = await tm.register_child(root.session_id, "explore", "reads the code", rules={"parent": "allow"})
    result = await tm.send_message(SendContext(root.session_id, run_id, tool_call_id), {"to": child.handle, "body": "hi"})

``send_message`` never raises for anything a model can cause: it returns the
success result or ``{"error": {"code": ..., "message": ...}}``. Every other
operation is one command through the session service (``SessionService.execute``).

Longer than the house's 200 lines on purpose: it is the whole host surface in
one place, and each method is a line or two of wiring.
"""

import asyncio
import time
from dataclasses import dataclass

import redis.asyncio as aioredis
from redis.exceptions import RedisError

from treemail.adapters import approvalindex, keys
from treemail.adapters.config import Config, load_config
from treemail.adapters.connection import connect
from treemail.adapters.eventstore import EventStore
from treemail.domain import commands as c
from treemail.domain import envelope, ids, notices
from treemail.domain import events as ev
from treemail.domain.commands import SendContext
from treemail.domain.errors import LifecycleError, Rejected
from treemail.domain.state import MailItem
from treemail.services.disposal import Disposed, DisposalService
from treemail.services.drains import DrainService
from treemail.services.sessions import SessionService
from treemail.services.settlement import SettlementService

from . import tool
from .client import CommandClient
from .wakes import Wake, WakeReader

__all__ = ["Treemail", "SendContext", "Registration", "Delivery", "Wake", "Disposed"]


@dataclass(frozen=True)
class Delivery:
    """One claimed message, rendered for the recipient's prompt."""

    message_id: str
    owner: str
    mode: str
    sender_session_id: str | None
    text: str


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
        self.sessions = SessionService(self.store, config)
        self.settlement = SettlementService(self.store, self.sessions)
        self.disposal = DisposalService(self.store, self.sessions, self.settlement)
        self.drains = DrainService(self.store, self.sessions)
        self.commands = CommandClient(redis, listener, config.service)
        self.wake_reader = WakeReader(redis, config.service)
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
        send_message_tool: bool = True, status: str = "queued", continuable: bool = True,
    ) -> Registration:
        """``continuable=False``: the host will never run it again once it finished; mail then is refused."""
        return await self._register(
            agent_type, description, rules, send_message_tool, status, parent_session_id, continuable
        )

    async def _register(
        self, agent_type, description, rules, send_message_tool, status, parent, continuable=True
    ) -> Registration:
        record = await self.sessions.register(
            agent_type=agent_type, description=description, rules=rules,
            send_message_tool=send_message_tool, status=status, parent_session_id=parent, continuable=continuable,
        )
        if parent is not None:
            await self.drains.inherit(record)
        return Registration(record.session_id, record.handle, record.root_session_id)

    async def set_status(self, session_id: str, status: str) -> None:
        if status not in c.STATUSES:
            raise ValueError(f"status must be queued, running, idle or finished, got {status!r}")
        await self.sessions.execute(c.ChangeStatus(session_id, status))

    # ---- delivery lifecycle ----------------------------------------------------------------------

    async def consume(self, session_id: str, message_id: str) -> None:
        """The model request that carried this claimed message succeeded."""
        await self.sessions.execute(c.ConsumeMail(session_id, message_id))

    async def release(self, session_id: str, message_id: str) -> None:
        """The model request failed: the message is due again and still counts as pending."""
        await self.sessions.execute(c.ReleaseMail(session_id, message_id))

    async def discard(self, session_id: str, message_id: str, reason: str = "") -> None:
        await self.sessions.execute(c.DiscardMail(session_id, message_id, reason))

    async def start_run(self, session_id: str, run_id: str) -> None:
        await self.sessions.execute(c.StartRun(session_id, run_id))

    async def finish_run(
        self, session_id: str, run_id: str, stop_reason: str | None = None, closing_text: str | None = None
    ) -> str | None:
        """With a ``stop_reason`` the run ended for good: the parent gets a settlement notice (seed 002).

        Returns the notice's gate (``not_announced``, ``parent_unavailable``,
        ``injected``, ``queued``, ``steered``, or ``failed``: logged and counted,
        the finish stands), or None without a stop reason.
        """
        _check_stop_reason(stop_reason)
        await self.sessions.execute(c.FinishRun(session_id, run_id))
        if stop_reason is None:
            return None
        return await self.settlement.settle(session_id, run_id, stop_reason, closing_text)

    async def claim(self, session_id: str, run_id: str) -> list[Delivery]:
        """At a safe model-request boundary: the mail due in this run, claimed by it, in acceptance order."""
        claimed = await self.sessions.execute(c.ClaimMail(session_id, run_id))
        if not claimed:
            return []
        record = await self.sessions.record(session_id)
        # The accepted events carry the bodies; claims name them by message id.
        accepted_at = {item.message_id: item.seq for item in await self.pending_mail(session_id)}
        seqs = [accepted_at[e.message_id] for e in claimed if e.message_id in accepted_at]
        accepted = await self.store.read_at(record, seqs)
        reply_hint = tool.tool_definition(record.rules, record.send_message_tool) is not None
        return [self._deliver(accepted[seq], reply_hint) for seq in seqs if seq in accepted]

    @staticmethod
    def _deliver(event: ev.ProducerMessageAccepted, reply_hint: bool) -> Delivery:
        if event.owner == "agent":
            sender = event.sender_handle or event.sender_session_id
            text = envelope.render_agent_message(sender, event.body, reply_hint)
        elif event.owner in notices.NOTICE_KINDS:
            text = notices.render_notice(event.owner, event.body)
        else:
            text = event.body
        return Delivery(event.message_id, event.owner, event.mode, event.sender_session_id, text)

    # ---- wake and reconcile --------------------------------------------------------------------------

    async def wakes(self, consumer: str, count: int = 10, block_ms: int = 1000) -> list[Wake]:
        """Wake triggers for this host runner (one consumer group shared by all runners)."""
        return await self.wake_reader.read(consumer, count, block_ms)

    async def wake_run(self, wake: Wake, run_id: str) -> bool:
        """Start the woken run (its due mail is admitted into it) and acknowledge the trigger.

        Returns False when the session is already running: its mail reaches
        the current run at the next boundary, so the trigger is simply acknowledged.
        """
        try:
            await self.start_run(wake.session_id, run_id)
            started = True
        except LifecycleError as error:
            # Running already, or disposed since the trigger was written: either way nothing to start.
            if error.code not in ("lifecycle:run_active", "lifecycle:closing"):
                raise
            started = False
        await self.wake_reader.ack(wake)
        return started

    async def reconcile(self, interrupted_runs: bool = False) -> int:
        """After a restart: make sure every session with mail due will be delivered to.

        With ``interrupted_runs`` (the host restarted, so no run survived),
        runs still open in the streams are finished, which releases the mail
        they had claimed, and their sessions become idle. Then every session
        asleep with mail due is asked to wake again (``RequestWake``), and
        every disposal interrupted after its cutoff is completed. Returns
        the number of wakes requested; a duplicate trigger is harmless.
        """
        written = 0
        for p in range(self.config.service.partitions):
            for session_id in await self.wake_reader.sessions(p):
                if interrupted_runs:
                    record = await self.sessions.record(session_id)
                    run = (await self.store.load(record)).state.current_run
                    if run is not None:
                        await self.finish_run(session_id, run)
                        await self.set_status(session_id, "idle")
                written += len(await self.sessions.execute(c.RequestWake(session_id)))
                # Seed 002: a disposal the host did not live to complete is completed now.
                await self.disposal.complete_interrupted(session_id)
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
        try:
            await self.sessions.execute(c.InjectMail(session_id, message_id, owner, body, mode))
        except LifecycleError as error:
            if error.code == "lifecycle:invalid_body":
                raise ValueError(error.message) from None
            raise
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
            if not await self._wait_for_approval(outcome["approval"]["request_id"]):
                return tool.engine_shutdown("the engine is shutting down while the send awaits approval")
        if "ok" in outcome:
            return outcome["ok"]
        return outcome

    async def _wait_for_approval(self, request_id: str) -> bool:
        while not self.commands.closing:
            try:
                request = await approvalindex.find(self.redis, request_id, self.config.service.partitions)
                if request is not None and request["status"] != "pending":
                    return True
                await self.redis.blpop([keys.approval_notify(request_id)], timeout=1)
            except RedisError:
                # A server blip: keep waiting; the request is durable and the next poll finds it.
                await asyncio.sleep(0.2)
        return False

    # ---- approvals ---------------------------------------------------------------------------------

    async def pending_approvals(self) -> list[dict]:
        requests = await approvalindex.every(self.redis, self.config.service.partitions)
        return [r for r in requests if r["status"] == "pending"]

    async def approve(self, request_id: str, scope: str = "once") -> dict:
        if scope not in ("once", "tree"):
            raise ValueError(f"scope must be once or tree, got {scope!r}")
        return await self._resolve(request_id, "approve_tree" if scope == "tree" else "approve_once")

    async def deny(self, request_id: str) -> dict:
        return await self._resolve(request_id, "deny")

    async def _resolve(self, request_id: str, decision: str) -> dict:
        request = await approvalindex.find(self.redis, request_id, self.config.service.partitions)
        if request is None:
            raise LookupError(f"no approval request has id {request_id}")
        try:
            await self.sessions.execute(c.ResolveApproval(request["sender_session_id"], request_id, decision))
        except LifecycleError as error:
            raise ValueError(error.message) from None
        await self.redis.lpush(keys.approval_notify(request_id), decision)
        await self.redis.expire(keys.approval_notify(request_id), 3600)
        return {**request, "status": "denied" if decision == "deny" else "approved", "decision": decision,
                "resolved_at": time.time()}

    # ---- history -------------------------------------------------------------------------------------

    async def history(self, session_id: str) -> list[tuple[int, ev.Event]]:
        record = await self.sessions.record(session_id)
        return await self.store.read(record)

    # ---- seed 002: disposal, draining, return guidance ------------------------------------------------

    async def dispose(
        self, session_id: str, stop_reason: str | None = None, closing_text: str | None = None
    ) -> Disposed:
        """Closing (the cutoff: sends to and from it are refused), pending agent mail returned to its
        senders as notices, closed; then, with a ``stop_reason``, the parent's settlement notice.
        Safe to call again to complete a disposal that was interrupted."""
        _check_stop_reason(stop_reason)
        return await self.disposal.dispose(session_id, stop_reason, closing_text)

    async def drain(self, session_id: str | None = None) -> int:
        """Refuse new sends from or to the whole service (no ``session_id``) or this session and every
        session below it (``send_message:draining``); accepted mail is still delivered."""
        return await self.drains.drain(session_id)

    async def undrain(self, session_id: str | None = None) -> int:
        return await self.drains.undrain(session_id)

    async def return_guidance(self, session_id: str) -> str | None:
        """The sentence to append to a child's first prompt, or None when it cannot message its parent."""
        record = await self.sessions.record(session_id)
        if record.parent_session_id is None:
            return None
        parent = await self.sessions.record(record.parent_session_id)
        return notices.return_guidance_for(record, parent.handle)

def _check_stop_reason(stop_reason: str | None) -> None:
    if stop_reason is not None and stop_reason not in c.STOP_REASONS:
        raise ValueError(f"stop_reason must be one of {', '.join(c.STOP_REASONS)}, got {stop_reason!r}")
