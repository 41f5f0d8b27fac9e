"""The host API: what an agent engine embeds (async).

    tm = await Treemail.connect()
    root = await tm.register_root("planner", "plans the work", rules={"child": "allow"})
    child = await tm.register_child(root.session_id, "explore", "reads the code", rules={"parent": "allow"})
    result = await tm.send_message(SendContext(root.session_id, run_id, tool_call_id), {"to": child.handle, "body": "hi"})

``send_message`` never raises for anything a model can cause: it returns the
success result or ``{"error": {"code": ..., "message": ...}}``. Every other
operation is one command through the session service (``SessionService.execute``).

``Treemail`` keeps the essentials: registration, runs, a send, the claimed
mail's lifecycle, wakes. The rest is reached through its parts, each built
once from the services ``wiring.py`` builds: ``tm.history``, ``tm.peers``,
``tm.interrupts``, ``tm.disposal``, ``tm.permissions``, ``tm.tools`` and
``tm.obligations``.
"""

import contextlib
import dataclasses
import functools

import redis.asyncio as aioredis

from treemail.adapters import metrics, tracing
from treemail.adapters.config import Config, load_config
from treemail.adapters.connection import connect
from treemail.domain import commands as c
from treemail.domain import ids, limits
from treemail.domain.commands import SendContext
from treemail.domain.decide.mailcontrol import with_send_options as mail_options
from treemail.domain.errors import InvalidRequest, LifecycleError, Rejected
from treemail.services.clock import SYSTEM_CLOCK, Clock
from treemail.services.tracecause import cause_traceparent

from ..tools import receipt as receipt_tool
from ..tools import search as search_tool
from ..tools import send_message as tool
from ..tools.table import Handlers

from . import wiring
from .approvals import ApprovalWait
from .delivery import Deliveries
from .disposal import Disposal, Disposed, check_closing_text, check_stop_reason
from .history import History
from .hostcall import host_context
from .interrupts import Interrupt, Interrupts
from .mailbox import Mailbox
from .obligations import Obligations
from .observe import Observed, SubscriptionGap
from .peers import Peers
from .permissions import Permissions
from .plugins import SendAttempt
from .subtree import Subtree
from .tools import Tools
from .types import Delivery, Registration, ToolResult
from .wakes import Wake

__all__ = [
    "Treemail", "SendContext", "Registration", "Delivery", "Wake", "Interrupt", "SendAttempt", "Observed",
    "SubscriptionGap", "ToolResult", "Disposed",
]


def _count(name: str, value: int | None) -> int | None:
    if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 0):
        raise limits.invalid(f"{name} must be a non-negative integer, got {limits.shown(value)}")
    return value


class Treemail:
    def __init__(self, redis: aioredis.Redis, listener: aioredis.Redis, config: Config,
                 clock: Clock = SYSTEM_CLOCK) -> None:
        self._services = s = wiring.build(redis, listener, config, clock)
        self._approval_wait = ApprovalWait(redis, config.service, s.commands, clock)
        self._deliveries = Deliveries(config, s.store, s.sessions, s.peers, s.keyring, self.discard)
        self.history = History(redis, config.service, s.store, s.sessions, s.drains, lambda: s.commands.closing)
        # Whole subtrees: the broadcast reads as mail (``tm.peers``), the cascading stop as disposal.
        subtree = Subtree(s.store, s.subtree, s.disposal, self.send_message, lambda: config.messaging.max_body_bytes)
        self.peers = Peers(s.store, s.sessions, s.peers, s.peer_driver, subtree=subtree)
        self.interrupts = Interrupts(s.sessions, s.store, s.interrupts, s.interrupt_reader, self.finish_run)
        self.disposal = Disposal(s.disposal, s.drains, subtree=subtree)
        self.permissions = Permissions(redis, config, s.store, s.sessions)
        self.obligations = Obligations(redis, config, s.store, s.sessions, s.wake_reader, s.obligations, s.disposal,
                                       clock, peers=s.peers, peer_driver=s.peer_driver)
        mailbox = Mailbox(s.listener, s.store, s.sessions, self._deliveries, config.messaging.attempt_timeout_s)
        self.tools = Tools(redis, config, s.store, s.sessions, mailbox, Handlers(
            send_message=self.send_message, interrupt_agent=self.interrupts.interrupt_agent,
            message_tools=self.obligations, peer_send=self.peers.send, peer_reply=self.peers.reply,
            peer_inbox=self.peers.inbox, peer_send_definition=self.peers.send_tool_definition,
            peer_reply_definition=self.peers.reply_tool_definition,
            peer_inbox_definition=self.peers.inbox_tool_definition,
            search_mail=functools.partial(search_tool.call, self.history),
            message_subtree=subtree.message_subtree,
            read_receipt=functools.partial(receipt_tool.call, self.history, s.store.directory),
        ))

    @classmethod
    async def connect(cls, config: Config | None = None, url: str | None = None,
                      clock: Clock = SYSTEM_CLOCK) -> "Treemail":
        """``clock``: what the host's decisions are dated by; a test passes ``treemail.testing.TestClock``."""
        config = config or load_config()
        tracing.configure_from_env()
        url = url or config.service.redis_url
        if not url:
            raise InvalidRequest("config:no_server", "no Redis URL: set REDIS_URL or [service] redis_url")
        redis = await connect(url, config.service)
        listener = await connect(url, config.service)
        host = cls(redis, listener, config, clock)
        await host._services.store.ensure_command_group(config.service.command_streams)
        await host._services.store.ensure_wake_groups(config.service.partitions)
        return host

    async def close(self) -> None:
        """Pending sends are answered send_message:engine_shutdown; nothing accepted is lost."""
        await self._services.commands.close()
        await self._services.listener.aclose()
        await self._services.redis.aclose()

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
        continuable: bool = True, accepts_images: bool = False, announced: bool = False,
    ) -> Registration:
        """``resident``/``continuable``: what direct routing asks of a child writing to its parent.
        ``continuable=False`` also says the host never runs it again once it finished (not resumable):
        treemail never wakes it, and mail to it, finished, is refused (``send_message:not_resumable``).
        ``announced=True``: the host hands the child its task directly (not as treemail mail), so its end
        is owed to its parent as a settlement notice (``tm.obligations.announce``)."""
        return await self._register(
            agent_type, description, rules, send_message_tool, status, parent_session_id, with_handle=with_handle,
            resident=resident, continuable=continuable, accepts_images=accepts_images, announced=announced,
        )

    async def _register(
        self, agent_type, description, rules, send_message_tool, status, parent, *, with_handle: bool = True,
        resident: bool = True, continuable: bool = True, accepts_images: bool = False, announced: bool = False,
    ) -> Registration:
        record = await self._services.sessions.register(
            agent_type=agent_type, description=description, rules=rules,
            send_message_tool=send_message_tool, status=status, parent_session_id=parent, with_handle=with_handle,
            resident=resident, continuable=continuable, accepts_images=accepts_images, announced=announced,
        )
        if parent is not None:
            await self._services.drains.inherit(record)
        return Registration(record.session_id, record.handle, record.root_session_id)

    async def set_status(self, session_id: str, status: str) -> None:
        if status not in c.STATUSES:
            raise limits.invalid(f"status must be queued, running, idle or finished, got {limits.shown(status)}")
        await self._services.sessions.execute(c.ChangeStatus(session_id, status))

    # ---- runs and wakes ---------------------------------------------------------------------------

    async def start_run(self, session_id: str, run_id: str, *, announced: bool = False) -> None:
        """``announced=True``: this run carries the task the host gave the child directly (its first run), so
        the child is announced in the same step (``tm.obligations.announce``)."""
        await self._services.sessions.execute(c.StartRun(session_id, run_id, announced))

    async def finish_run(
        self, session_id: str, run_id: str, reason: str | None = None, closing_text: str | list | None = None
    ) -> str | None:
        """The run ended; unacknowledged claims are released and the session is idle.

        ``reason``: how it ended (completed, aborted, max_tokens, refusal or
        error). Given one, the run's turn is over and the parent is told (the
        settlement a finish owes): a settlement notice with the summary line
        for the reason and ``closing_text``, the child's closing message: a
        string, or its last message's content blocks (the text blocks are kept
        in order, byte for byte; reasoning and tool calls are left out); an
        empty one reads as no closing message. Gated;
        returns the gate (``not_announced``, ``parent_unavailable``,
        ``injected``, ``queued``, ``steered``, or ``failed``: logged and
        counted, the finish stands). Without one the run is recorded as
        completed and nobody is told (a run the host will take up again);
        returns None.
        """
        check_stop_reason(reason)
        closing_text = check_closing_text(closing_text)
        return await self._services.settlement.finish(session_id, run_id, reason, closing_text)

    async def wakes(self, consumer: str, count: int = 10, block_ms: int = 1000) -> list[Wake]:
        """Wake triggers for this host runner (one consumer group shared by all runners)."""
        return await self._services.wake_reader.read(consumer, count, block_ms)

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
        await self._services.wake_reader.ack(wake)
        return started

    # ---- delivery lifecycle ----------------------------------------------------------------------

    async def claim(self, session_id: str, run_id: str, step: int | None = None) -> list[Delivery]:
        """At a safe model-request boundary: the mail due in this run, claimed by it, in acceptance order.

        ``step``: the engine's number for this boundary (its model request) in the run; recorded with the
        claim so the mailbox timeline says which step saw which message (``treemail timeline``).
        """
        return await self._deliveries.claim(session_id, run_id, _count("step", step))

    async def consume(self, session_id: str, message_id: str, *, step: int | None = None,
                      tokens: int | None = None) -> None:
        """The model request that carried this claimed message succeeded.

        ``step``: that request's step in the run; ``tokens``: what the delivered message cost in the
        recipient's context. Both optional, recorded for the mailbox timeline.
        """
        step, tokens = _count("step", step), _count("tokens", tokens)
        async with self._delivery_span("consume", session_id, message_id):
            # Recorded with the consume: the run's next send continues this span's trace.
            traceparent = tracing.traceparent() if tracing.enabled() else ""
            await self._services.sessions.execute(c.ConsumeMail(session_id, message_id, step, tokens, traceparent))

    async def release(self, session_id: str, message_id: str, reason: str = "") -> None:
        """The model request failed: a failed attempt; due again after a backoff, parked once the budget is spent.

        ``reason``: why, in the host's words (one line, at most 200 characters; else ``lifecycle:invalid_reason``
        and nothing stored); ``tm.obligations.inspect`` shows it as the message's latest reason."""
        async with self._delivery_span("release", session_id, message_id):
            events = await self._services.sessions.execute(c.ReleaseMail(session_id, message_id, reason))
            metrics.count_steer_fallbacks(events)  # flow control: steer mail handed back at its last boundary

    async def discard(self, session_id: str, message_id: str, reason: str = "") -> None:
        async with self._delivery_span("discard", session_id, message_id):
            await self._services.sessions.execute(c.DiscardMail(session_id, message_id, reason))

    @contextlib.asynccontextmanager
    async def _delivery_span(self, step: str, session_id: str, message_id: str):
        """A delivery step is a span of the message's own trace (read only when tracing is on)."""
        if not tracing.enabled():
            yield
            return
        record = await self._services.sessions.record(session_id)
        item = (await self._services.store.load_mail_items(record, [message_id])).get(message_id)
        parent = item.trace if item else None
        with tracing.span(f"treemail.{step}", parent or None, message_id=message_id, session_id=session_id):
            yield

    async def inject(self, session_id: str, owner: str, body: str, mode: str = "queue") -> str:
        """Mail from a plugin, a delegation notification or a goal: never counted by the agent guards.

        Input that is not what is asked for (an owner or mode outside theirs, a body that is not text, blank,
        or over ``max_injected_body_bytes``) is refused with ``IdentifierError`` (a ValueError with its code),
        nothing stored."""
        if owner not in ("plugin", "delegation", "goal"):
            raise limits.IdentifierError(limits.INVALID, "owner must be plugin, delegation or goal")
        if mode not in ("steer", "queue"):
            raise limits.IdentifierError(limits.INVALID, "mode must be steer or queue")
        limits.require_text("body", body, self._services.config.messaging.max_injected_body_bytes, empty=True)
        message_id = ids.uuid7()
        try:
            await self._services.sessions.execute(c.InjectMail(session_id, message_id, owner, body, mode))
        except LifecycleError as error:
            if error.code == "lifecycle:invalid_body":
                raise limits.IdentifierError(limits.INVALID, error.message) from None
            raise
        return message_id

    # ---- the model-facing send -------------------------------------------------------------------

    async def tool_definition(self, session_id: str) -> dict | None:
        services = self._services
        record = await services.sessions.record(session_id)
        messaging = services.config.messaging
        state = (await services.store.load(record)).state
        return tool.tool_definition(
            record.rules, record.send_message_tool, messaging.routing, messaging.content_blocks,
            overlay=state.rules_overlay, threads=messaging.threads, mail_control=messaging.mail_control,
            urgent=c.URGENT_SEND in state.installed_tools,
        )

    async def send_message_for_model(self, context: SendContext, arguments) -> ToolResult:
        """``send_message`` with the one-line text a model reads as the tool result (``tool.result_text``)."""
        result = await self.send_message(context, arguments)
        return ToolResult(result, tool.result_text(result), "error" in result)

    async def send_message(self, context: SendContext, arguments, *, numbered: bool = False) -> dict:
        """A model's send_message call. Its result is exactly ``message_id``, ``mode`` and ``recipient_state``;
        ``sequence`` (the message's number in its pair) is added where the sender has the ``read_receipt`` tool,
        or where the host asks for it here (``numbered=True``)."""
        return await self._send(context, arguments, numbered=numbered)

    async def _send(self, context: SendContext, arguments, urgent: bool | None = None,
                    expires_in_s: float | None = None, supersede_key: str | None = None,
                    numbered: bool = False) -> dict:
        """``send_message``, with the host's own send options when it gave them. ``urgent``: the host's own
        choice for this send; None: the model's `urgent` argument, where the host enabled it for the sender
        (only then is the sender's state read for it). Expiry and supersede key: the host's, or the model's
        where ``[messaging] mail_control`` offers them."""
        try:
            messaging = self._services.config.messaging
            may_urgent = isinstance(arguments, dict) and "urgent" in arguments and await self._urgent_send(context)
            parsed = tool.parse_arguments(arguments, messaging.content_blocks, messaging.threads,
                                          messaging.mail_control, may_urgent)
            if urgent is not None:
                parsed = dataclasses.replace(parsed, urgent=urgent)
            if numbered:
                parsed = dataclasses.replace(parsed, numbered=True)
            tool.require_storable(parsed, messaging)
            if expires_in_s is not None or supersede_key is not None:
                parsed = mail_options(parsed, expires_in_s, supersede_key)
            if parsed.in_reply_to is not None:
                parsed = await self.history.joined_thread(context.session_id, parsed)
        except Rejected as rejection:
            return tool.error_result(rejection.code.value, rejection.message)
        refusal = await self.permissions.gate(context, parsed)
        if refusal is not None:
            return refusal
        # A message continues the trace of the one that caused it: a conversation is one trace.
        cause = await cause_traceparent(self._services.store, context.session_id, context.run_id)
        with tracing.span("treemail.prepare", cause, sender_session_id=context.session_id, run_id=context.run_id):
            outcome = await self._approval_wait.request(context, parsed)
        if "ok" in outcome:
            return outcome["ok"]
        return outcome

    async def _urgent_send(self, context: SendContext) -> bool:
        record = await self._services.store.directory.get(context.session_id)
        return record is not None and c.URGENT_SEND in (await self._services.store.load(record)).state.installed_tools

    async def send(self, sender_session_id: str, to: str, body: str, *, mode: str = "steer",
                   idempotency_key: str | None = None, run_id: str | None = None, urgent: bool = False,
                   expires_in_s: float | None = None, supersede_key: str | None = None) -> dict:
        """A programmatic send by the host (not a model's tool call), under the caller's own idempotency key.

        The same key (for this sender and ``run_id``) returns the first
        result and delivers once; no key means a new send each call. Results
        and errors are those of ``send_message``. ``run_id``: the run it is
        sent from, by default the sender's open run (exact live sender: only a
        session's open run may send; with none open it is ``sender_not_live``).
        ``expires_in_s``: the message expires unclaimed that long after it is accepted (never reaches a
        model; settled as expired). ``supersede_key``: it replaces the unclaimed older message this sender
        sent the recipient with the same key. Both: see the mail-control page. ``urgent``: claimed ahead of
        the recipient's normal mail, within ``[messaging] urgent_starvation_bound``; every guard still applies.
        The result is ``send_message``'s with the message's number in its pair (``sequence``) always added.
        """
        context = await host_context(self._services.store, sender_session_id, idempotency_key, run_id)
        return await self._send(context, {"to": to, "body": body, "mode": mode}, urgent, expires_in_s, supersede_key,
                                numbered=True)
