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
once over the host's services by its bootstrap (``wiring.py``): ``tm.history``,
``tm.peers``, ``tm.interrupts``, ``tm.disposal``, ``tm.permissions``,
``tm.tools`` and ``tm.obligations``.
"""

from treemail.adapters import tracing
from treemail.adapters.config import Config, load_config
from treemail.domain import commands as c
from treemail.domain import ids, limits
from treemail.domain.commands import SendContext
from treemail.domain.errors import LifecycleError
from treemail.domain.triggers import Interrupt, Wake
from treemail.services import bootstrap
from treemail.services.clock import SYSTEM_CLOCK, Clock
from treemail.services.subscriptions import Observed, SubscriptionGap

from ..tools import send_message as tool

from . import wiring
from .disposal import Disposed, check_closing_text, check_stop_reason
from .plugins import SendAttempt
from .types import Delivery, Registration, ToolResult

__all__ = [
    "Treemail", "SendContext", "Registration", "Delivery", "Wake", "Interrupt", "SendAttempt", "Observed",
    "SubscriptionGap", "ToolResult", "Disposed",
]


def _count(name: str, value: int | None) -> int | None:
    if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 0):
        raise limits.invalid(f"{name} must be a non-negative integer, got {limits.shown(value)}")
    return value


class Treemail:
    def __init__(self, redis, listener, config: Config, clock: Clock = SYSTEM_CLOCK) -> None:
        """``redis``, ``listener``: the host's two server connections (``connect`` opens them)."""
        host = wiring.build(redis, listener, config, clock)
        self._services = host.services
        self._sending = host.sending
        self._deliveries = host.deliveries
        self.history = host.history
        self.peers = host.peers
        self.interrupts = host.interrupts
        self.disposal = host.disposal
        self.permissions = host.permissions
        self.obligations = host.obligations
        self.tools = host.tools

    @classmethod
    async def connect(cls, config: Config | None = None, url: str | None = None,
                      clock: Clock = SYSTEM_CLOCK) -> "Treemail":
        """``clock``: what the host's decisions are dated by; a test passes ``treemail.testing.TestClock``."""
        config = config or load_config()
        tracing.configure_from_env()
        host = cls(*await bootstrap.connections(config, url), config, clock)
        await host._services.prepare()
        return host

    async def close(self) -> None:
        """Pending sends are answered send_message:engine_shutdown; nothing accepted is lost."""
        await self._services.close()

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
        limits.require_id("parent_session_id", parent_session_id)  # None would register a root
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
        return await self._services.triggers.wakes(consumer, count, block_ms)

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
        await self._services.triggers.ack_wake(wake)
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
        await self._deliveries.consume(session_id, message_id, _count("step", step), _count("tokens", tokens))

    async def release(self, session_id: str, message_id: str, reason: str = "") -> None:
        """The model request failed: a failed attempt; due again after a backoff, parked once the budget is spent.

        ``reason``: why, in the host's words (one line, at most 200 characters; else ``lifecycle:invalid_reason``
        and nothing stored); ``tm.obligations.inspect`` shows it as the message's latest reason."""
        await self._deliveries.release(session_id, message_id, reason)

    async def discard(self, session_id: str, message_id: str, reason: str = "") -> None:
        await self._deliveries.discard(session_id, message_id, reason)

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
        """The session's send_message tool, or None where its rules hide it (``tm.tools.definition``)."""
        return await self.tools.definition(session_id, tool.TOOL_NAME)

    async def send_message_for_model(self, context: SendContext, arguments) -> ToolResult:
        """``send_message`` with the one-line text a model reads as the tool result (``tool.result_text``)."""
        return await self._sending.for_model(context, arguments)

    async def send_message(self, context: SendContext, arguments, *, numbered: bool = False) -> dict:
        """A model's send_message call. Its result is exactly ``message_id``, ``mode`` and ``recipient_state``;
        ``sequence`` (the message's number in its pair) is added where the sender has the ``read_receipt`` tool,
        or where the host asks for it here (``numbered=True``)."""
        return await self._sending.send_message(context, arguments, numbered=numbered)

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
        return await self._sending.host_send(
            sender_session_id, to, body, mode=mode, idempotency_key=idempotency_key, run_id=run_id, urgent=urgent,
            expires_in_s=expires_in_s, supersede_key=supersede_key)
