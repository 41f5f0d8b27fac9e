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

import contextlib
import time
from dataclasses import dataclass

import redis.asyncio as aioredis

from treemail.adapters import tokens, tracing
from treemail.adapters.config import Config, load_config
from treemail.adapters.connection import connect
from treemail.adapters.eventstore import EventStore
from treemail.domain import commands as c
from treemail.domain import blocks, effective, envelope, ids, notices, permissions
from treemail.domain import events as ev
from treemail.domain.commands import SendContext
from treemail.domain.decide import routing
from treemail.domain.errors import LifecycleError, Rejected
from treemail.domain.state import MailItem
from treemail.services.disposal import Disposed
from treemail.services.obligations import ObligationService
from treemail.services.sessions import SessionService

from treemail.producers.client import CommandClient
from treemail.producers.tools import schemas as toolschemas
from treemail.producers.tools import send_message as tool
from treemail.producers.tools import table as tools

from . import obligations as inspection
from . import observe as subscriptions
from . import plugins
from .approvals import ApprovalHost
from .disposal import DisposalHost, check_stop_reason
from .interrupts import Interrupt, InterruptHost
from .observe import MAIL_EVENTS, Observed, SubscriptionGap
from .peers import PeerHost
from .plugins import SendAttempt, SendHook
from .wakes import Wake, WakeReader

__all__ = [
    "Treemail", "SendContext", "Registration", "Delivery", "Wake", "Interrupt", "SendAttempt", "Observed",
    "SubscriptionGap", "ToolResult", "Disposed",
]


@dataclass(frozen=True)
class ToolResult:
    """A send_message result as a model-facing tool result: the structured result and the text a model reads."""

    result: dict
    text: str
    is_error: bool


@dataclass(frozen=True)
class Delivery:
    """One claimed message, rendered for the recipient's prompt."""

    message_id: str
    owner: str
    mode: str
    sender_session_id: str | None
    text: str
    # The message as the host's content parts, in order: the rendered text, then its images (content blocks).
    parts: tuple[dict, ...] = ()
    # seed 004 part 2: the principal of mail over a peer route; verified: its source proof held (proofs on).
    principal: str | None = None
    verified: bool = False


@dataclass(frozen=True)
class Registration:
    session_id: str
    # None for a session registered without a handle: it is addressed by its UUID.
    handle: str | None
    root_session_id: str


class Treemail(InterruptHost, PeerHost, DisposalHost, ApprovalHost):
    def __init__(self, redis: aioredis.Redis, listener: aioredis.Redis, config: Config) -> None:
        self.config = config
        self.redis = redis
        self.store = EventStore(redis, config.service)
        self.sessions = SessionService(self.store, config)
        self.commands = CommandClient(redis, listener, config.service, self.store.directory)
        self.wake_reader = WakeReader(redis, config.service)
        self._init_interrupts()
        self.obligations = ObligationService(self.sessions)
        self._init_peers()
        self._init_disposal()
        self._listener = listener
        self._send_hooks: list[SendHook] = []

    @classmethod
    async def connect(cls, config: Config | None = None, url: str | None = None) -> "Treemail":
        config = config or load_config()
        tracing.configure_from_env()
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
        status: str = "running", with_handle: bool = True, accepts_images: bool = False,
    ) -> Registration:
        """``rules``: the message rules, or per action: ``{"message": ..., "interrupt": ...}``.

        ``with_handle=False`` registers a pre-handle session: addressed, and replied to, by its UUID.
        """
        return await self._register(
            agent_type, description, rules, send_message_tool, status, None, with_handle=with_handle,
            accepts_images=accepts_images,
        )

    async def register_child(
        self, parent_session_id: str, agent_type: str, description: str = "", *, rules=None,
        send_message_tool: bool = True, status: str = "queued", with_handle: bool = True, resident: bool = True,
        continuable: bool = True, accepts_images: bool = False,
    ) -> Registration:
        """``resident``/``continuable``: what direct routing asks of a child writing to its parent.
        ``continuable=False`` also says the host never runs it again once it finished (seed 002): treemail
        never wakes it, and mail to it, finished, is refused (``send_message:not_resumable``)."""
        return await self._register(
            agent_type, description, rules, send_message_tool, status, parent_session_id, with_handle=with_handle,
            resident=resident, continuable=continuable, accepts_images=accepts_images,
        )

    async def _register(
        self, agent_type, description, rules, send_message_tool, status, parent, *, with_handle: bool = True,
        resident: bool = True, continuable: bool = True, accepts_images: bool = False,
    ) -> Registration:
        record = await self.sessions.register(
            agent_type=agent_type, description=description, rules=rules,
            send_message_tool=send_message_tool, status=status, parent_session_id=parent, with_handle=with_handle,
            resident=resident, continuable=continuable, accepts_images=accepts_images,
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
        async with self._delivery_span("consume", session_id, message_id):
            await self.sessions.execute(c.ConsumeMail(session_id, message_id))

    async def release(self, session_id: str, message_id: str) -> None:
        """The model request failed: a failed attempt; due again after a backoff, parked once the budget is spent."""
        async with self._delivery_span("release", session_id, message_id):
            await self.sessions.execute(c.ReleaseMail(session_id, message_id))

    async def discard(self, session_id: str, message_id: str, reason: str = "") -> None:
        async with self._delivery_span("discard", session_id, message_id):
            await self.sessions.execute(c.DiscardMail(session_id, message_id, reason))

    @contextlib.asynccontextmanager
    async def _delivery_span(self, step: str, session_id: str, message_id: str):
        """Seed 004: a delivery step is a span of the message's own trace (read only when tracing is on)."""
        if not tracing.enabled():
            yield
            return
        record = await self.sessions.record(session_id)
        item = (await self.store.load_mail_items(record, [message_id])).get(message_id)
        parent = item.trace if item else None
        with tracing.span(f"treemail.{step}", parent or None, message_id=message_id, session_id=session_id):
            yield

    async def start_run(self, session_id: str, run_id: str) -> None:
        await self.sessions.execute(c.StartRun(session_id, run_id))

    async def finish_run(
        self, session_id: str, run_id: str, reason: str | None = None, closing_text: str | None = None
    ) -> str | None:
        """The run ended; unacknowledged claims are released and the session is idle.

        ``reason``: how it ended (completed, aborted, max_tokens, refusal or
        error). Given one, the run's turn is over and the parent is told (seed
        002): a settlement notice with the summary line for the reason and
        ``closing_text`` (the child's last words), gated as the seed says;
        returns the gate (``not_announced``, ``parent_unavailable``,
        ``injected``, ``queued``, ``steered``, or ``failed``: logged and
        counted, the finish stands). Without one the run is recorded as
        completed and nobody is told (a run the host will take up again);
        returns None.
        """
        check_stop_reason(reason)
        await self.sessions.execute(c.FinishRun(session_id, run_id, reason or "completed"))
        if reason is None:
            return None
        return await self.settlement.settle(session_id, run_id, reason, closing_text)

    async def claim(self, session_id: str, run_id: str) -> list[Delivery]:
        """At a safe model-request boundary: the mail due in this run, claimed by it, in acceptance order."""
        claimed = await self.sessions.execute(c.ClaimMail(session_id, run_id))
        if not claimed:
            return []
        record = await self.sessions.record(session_id)
        # The accepted events carry the bodies; claims name them by message id (only those are read).
        items = await self.store.load_mail_items(record, [e.message_id for e in claimed])
        claimed_at = [(e.message_id, items[e.message_id].seq) for e in claimed if e.message_id in items]
        # seed 004 part 2: entries are read tolerantly and each source proof is checked (producers/peers.py).
        accepted = await self._read_claimed(record, [seq for _, seq in claimed_at])
        for event in accepted.values():
            if isinstance(event, ev.ProducerMessageAccepted):
                with tracing.span("treemail.claim", event.traceparent, message_id=event.message_id,
                                  session_id=session_id, run_id=run_id):
                    pass
        overlay = (await self.store.load(record)).state.rules_overlay
        reply_hint = tool.tool_definition(record.rules, record.send_message_tool, overlay=overlay) is not None
        return await self._deliver_claimed(record, [(mid, accepted[seq]) for mid, seq in claimed_at], reply_hint)

    @staticmethod
    def _deliver(event: ev.ProducerMessageAccepted, reply_hint: bool, *, text: str | None = None,
                 verified: bool = False) -> Delivery:
        if text is None and event.owner == "agent":
            sender = event.sender_handle or event.sender_session_id
            text = envelope.render_agent_message(sender, event.body, reply_hint)
        elif text is None and event.owner in notices.NOTICE_KINDS:
            # Seed 002: treemail's own words, never rendered as (or credited to) an agent's message.
            text = notices.render_notice(event.owner, event.body)
        elif text is None:
            text = event.body
        parts = ({"type": "text", "text": text}, *blocks.image_parts(event.blocks))
        return Delivery(event.message_id, event.owner, event.mode, event.sender_session_id, text, parts,
                        principal=event.principal, verified=verified)

    async def _may_reply(self, record, event: ev.ProducerMessageAccepted) -> bool:
        sender = await self.store.directory.get(event.sender_session_id) if event.owner == "agent" else None
        return sender is not None and routing.may_address(self.config.messaging.routing, record, sender)

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
        """After a restart: make sure every obligation is kept; what the delivery pump does at start.

        With ``interrupted_runs`` (the host restarted, so no run survived),
        runs still open in the streams are finished, which releases the mail
        they had claimed, and their sessions become idle. Then every session
        with pending mail gets ``KeepObligations``: expired claims released,
        passed deadlines parked, and a sleeping session with mail due asked to
        wake again, even if a wake was requested before this call (its trigger
        may be lost). Returns the number of wakes requested; a duplicate
        trigger is harmless. With ``interrupted_runs``, every disposal the
        host did not live to complete after its cutoff is completed (seed 002).
        """
        started = time.time()
        finished: list[ev.Event] = []
        if interrupted_runs:
            for p in range(self.config.service.partitions):
                for session_id in await self.wake_reader.sessions(p):
                    record = await self.sessions.record(session_id)
                    state = (await self.store.load(record)).state
                    run = state.current_run
                    if run is not None:
                        finished += await self.sessions.execute(c.FinishRun(session_id, run), record)
                        finished += await self.sessions.execute(c.ChangeStatus(session_id, "idle"), record)
                    if state.disposal == "closing":
                        await self.disposal.complete_interrupted(session_id)
        woken = sum(isinstance(e, ev.SessionWakeRequested) for e in finished)
        return woken + (await self.obligations.sweep(stale_before=started)).wakes

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
        messaging = self.config.messaging
        overlay = (await self.store.load(record)).state.rules_overlay
        return tool.tool_definition(
            record.rules, record.send_message_tool, messaging.routing, messaging.content_blocks, overlay=overlay
        )

    async def send_message_for_model(self, context: SendContext, arguments) -> ToolResult:
        """``send_message`` with the one-line text a model reads as the tool result (``tool.result_text``)."""
        result = await self.send_message(context, arguments)
        return ToolResult(result, tool.result_text(result), "error" in result)

    result_text = staticmethod(tool.result_text)

    async def send_message(self, context: SendContext, arguments) -> dict:
        try:
            parsed = tool.parse_arguments(arguments, self.config.messaging.content_blocks)
            tool.require_storable(parsed, self.config.messaging)
        except Rejected as rejection:
            return tool.error_result(rejection.code.value, rejection.message)
        if self._send_hooks:
            refusal = await self._gate(context, parsed)
            if refusal is not None:
                return refusal
        with tracing.span("treemail.prepare", sender_session_id=context.session_id, run_id=context.run_id):
            outcome = await self._request(context, parsed)
        if "ok" in outcome:
            return outcome["ok"]
        return outcome

    async def send(self, sender_session_id: str, to: str, body: str, *, mode: str = "steer",
                   idempotency_key: str | None = None, run_id: str | None = None) -> dict:
        """A programmatic send by the host (not a model's tool call), under the caller's own idempotency key.

        The same key (for this sender and ``run_id``) returns the first
        result and delivers once; no key means a new send each call. Results
        and errors are those of ``send_message``. ``run_id``: the run it is
        sent from, by default the sender's open run (seed 002: only a
        session's open run may send; with none open it is ``sender_not_live``).
        """
        if idempotency_key is not None and not (isinstance(idempotency_key, str) and 0 < len(idempotency_key) <= 200):
            raise ValueError("idempotency_key must be a non-empty string of at most 200 characters")
        call = f"key:{idempotency_key}" if idempotency_key is not None else f"host:{ids.uuid7()}"
        if run_id is None:
            record = await self.store.directory.get(sender_session_id)
            run_id = (await self.store.load(record)).state.current_run if record is not None else None
        return await self.send_message(SendContext(sender_session_id, run_id or "", call),
                                       {"to": to, "body": body, "mode": mode})

    async def inspect(self, message_id: str, caller_session_id: str | None = None) -> dict:
        """A sent message's status (seed 004): accepted with its receipt, processed, parked or refused.

        ``caller_session_id``: the session asking (the sender or a session it
        was delegated from); None is the host itself. Errors are dicts with a
        stable code (``message:unknown``, ``permission_denied``).
        """
        return await inspection.inspect(self, message_id, caller_session_id)

    async def retry(self, message_id: str, caller_session_id: str | None = None) -> dict:
        """Renew a parked message's retry budget; ``retry_message:settled`` for a processed or refused one."""
        return await inspection.retry(self, message_id, caller_session_id)

    # ---- every installed tool, for any agent (producers/tools.py is the table) -----------------

    async def tool_schemas(self, session_id: str, format: str = "anthropic") -> list[dict]:
        """The session's tools as ``anthropic``, ``openai`` (function tools, strict where possible) or ``mcp``."""
        record = await self.sessions.record(session_id)
        return toolschemas.export(await tools.installed(self, record), format)

    async def install_tools(self, session_id: str, names) -> list[str]:
        """Offer exactly these optional tools to the session's model (one by one: inspect_message,
        retry_message, send_to_peer, reply_to_peer, peer_inbox); each still needs its grant. An event on
        the session's stream (``ToolsInstalled``). Returns what is installed now."""
        if isinstance(names, str):
            raise ValueError("names must be a list of tool names, not one string")
        await self.sessions.execute(c.InstallTools(session_id, tuple(names)))
        record = await self.sessions.record(session_id)
        return list((await self.store.load(record)).state.installed_tools)

    async def call_tool(self, context: SendContext, name: str, arguments) -> dict:
        """A model's call of any installed tool by name; like send_message, it never raises for model input."""
        return await tools.call(self, context, name, arguments)

    async def mint_token(self, session_id: str, run_id: str | None = None, ttl_s: int | None = None) -> str:
        """A bearer token binding an MCP connection to this session (and run, else its current one)."""
        await self.sessions.record(session_id)
        return await tokens.mint(self.redis, session_id, run_id, ttl_s)

    async def revoke_token(self, token: str) -> bool:
        return await tokens.revoke(self.redis, token)

    # ---- effective permissions -----------------------------------------------------------------------

    async def set_message_rules(self, session_id: str, rules) -> None:
        """Lay ``rules`` over the session's agent-document rules at run time (None or empty: remove the
        overlay). Recorded as ``MessageRulesOverlaid`` on the session's stream; sends decide on it."""
        normalized = permissions.normalize_rules(rules)
        await self.sessions.execute(c.OverlayMessageRules(session_id, normalized))

    async def effective_permissions(self, session_id: str) -> dict:
        """The tool's visibility and, per label (parent, child, sibling, *), its effect, the rule that
        decided it and the sessions it covers (``effective.render_report`` prints it)."""
        record = await self.sessions.record(session_id)
        overlay = (await self.store.load(record)).state.rules_overlay
        peers = await self.store.directory.tree_peers(record)
        return effective.report(record, overlay, peers, self.config.messaging.enabled)

    # ---- history -------------------------------------------------------------------------------------

    async def history(self, session_id: str) -> list[tuple[int, ev.Event]]:
        record = await self.sessions.record(session_id)
        return await self.store.read(record)

    # ---- revert and fork (mail follows the session's log; see domain/decide/branches.py) ----------------

    async def position(self, session_id: str) -> int:
        """The session's current stream position: note it beside the engine's own log to revert or fork there."""
        return (await self.store.load(await self.sessions.record(session_id))).version

    async def revert(self, session_id: str, to_position: int) -> list[str]:
        """The engine reverted the session's history to ``to_position``. Returns the mail due again.

        Claims and consumptions after that position are undone (released, restored); mail accepted after it
        stays pending; an open run ends. Raises LifecycleError ``lifecycle:invalid_position`` for a position
        outside the history or on a branch already reverted.
        """
        events = await self.sessions.execute(c.RevertSession(session_id, to_position))
        undone = (ev.ProducerMessageRestored, ev.ProducerMessageReleased)
        return [e.message_id for e in events if isinstance(e, undone)]

    async def fork(
        self, session_id: str, at_position: int, *, description: str | None = None, status: str = "idle"
    ) -> Registration:
        """A new session (own id and handle, same tree and origin) forked from ``session_id`` at ``at_position``.

        The source's pending mail stays with the source (it is delivered once, there). A fork below a
        draining session drains too (seed 002), as any session registered there does.
        """
        record = await self.sessions.fork(session_id, at_position, description=description, status=status)
        if record.parent_session_id is not None:
            await self.drains.inherit(record)
        return Registration(record.session_id, record.handle, record.root_session_id)

    # ---- plugins: observe and gate (producers/plugins.py, producers/subscriptions.py) -------------------

    def add_send_hook(self, hook: SendHook):
        """Run ``hook(SendAttempt)`` before every send is decided; it returns None, or a reason to refuse.

        Returns a function that removes the hook.
        """
        self._send_hooks.append(hook)
        return lambda: self._send_hooks.remove(hook) if hook in self._send_hooks else None

    async def _gate(self, context: SendContext, arguments) -> dict | None:
        sender = await self.store.directory.get(context.session_id)
        if await plugins.already_decided(self.redis, sender, context):
            return None  # a retry: the recorded outcome answers it, whatever the hooks say now
        return await plugins.ask_hooks(self._send_hooks, context, arguments)

    async def subscription_position(self) -> str:
        """Where every feed ends now: ``subscribe(after=...)`` from it misses nothing appended later."""
        return str(await subscriptions.starting_position(self.redis, self.config.service.partitions, None))

    def subscribe(self, after: str | None = None, *, types=MAIL_EVENTS, block_ms: int = 1000):
        """Every session's mail events as ``(position, session_id, event)``, live, until the host closes.

        ``after``: None (from now), ``"start"`` (from the oldest event the feeds hold) or a position yielded
        earlier (resume after it). ``types=None`` yields every event type.
        """
        return subscriptions.subscribe(
            self.redis, self.config.service, after, types, lambda: self.commands.closing, block_ms
        )
