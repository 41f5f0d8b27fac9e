"""The one way a tree send goes out: a model's tool call, the MCP tool, the host's own send, a broadcast copy.

The model's arguments are parsed strictly here (``producers/tools/send_message``),
the send answering a message joins its thread, the host's pre-send hooks are
asked (``tm.permissions``), and the command goes to the worker pool through
``ApprovalWait`` (which, under an `ask` rule, waits for a person). A send never
raises for anything a model can cause: it returns the success result or
``{"error": {"code": ..., "message": ...}}``.
"""

import dataclasses

from treemail.adapters import tracing
from treemail.domain import commands as c
from treemail.domain import events as ev
from treemail.domain.commands import SendArguments, SendContext
from treemail.domain.decide.mailcontrol import with_send_options as mail_options
from treemail.domain.decide.sendfields import require_storable
from treemail.domain.errors import Code, Rejected
from treemail.services.approvals import ApprovalWait
from treemail.services.sessionreader import SessionReader

from ..tools import send_message as tool

from .hostcall import host_context, require_context
from .permissions import Permissions
from .shared import Part, Shared
from .types import ToolResult


async def joined_thread(reader: SessionReader, session_id: str, arguments: SendArguments) -> SendArguments:
    """The send answering ``arguments.in_reply_to`` joins that message's thread; only a message the sender
    received can be answered (``send_message:unknown_reply`` otherwise: an id never reads another's mail)."""
    record = await reader.record(session_id)
    for _, event in reversed(await reader.history(record)):
        if isinstance(event, ev.ProducerMessageAccepted) and event.message_id == arguments.in_reply_to:
            return dataclasses.replace(arguments, thread_id=event.thread_of)
    raise Rejected(Code.UNKNOWN_REPLY, f"you received no message {arguments.in_reply_to}: give the "
                                       "message_id of a message you are answering")


class Sending(Part):
    def __init__(self, shared: Shared, permissions: Permissions, approvals: ApprovalWait) -> None:
        super().__init__(shared)
        self._messaging = shared.config.messaging
        self._permissions = permissions
        self._approvals = approvals

    async def send_message(self, context: SendContext, arguments, *, urgent: bool | None = None,
                           expires_in_s: float | None = None, supersede_key: str | None = None,
                           numbered: bool = False) -> dict:
        """A model's send_message call, with the host's own send options when it gave them. ``urgent``: the
        host's own choice for this send; None: the model's `urgent` argument, where the host enabled it for the
        sender (only then is the sender's state read for it). Expiry and supersede key: the host's, or the
        model's where ``[messaging] mail_control`` offers them. ``numbered``: the result carries the message's
        number in its pair (``sequence``) whatever the sender's tools."""
        require_context(context)
        try:
            messaging = self._messaging
            may_urgent = isinstance(arguments, dict) and "urgent" in arguments and await self._urgent_send(context)
            parsed = tool.parse_arguments(arguments, messaging.content_blocks, messaging.threads,
                                          messaging.mail_control, may_urgent)
            if urgent is not None:
                parsed = dataclasses.replace(parsed, urgent=urgent)
            if numbered:
                parsed = dataclasses.replace(parsed, numbered=True)
            require_storable(parsed, messaging)
            if expires_in_s is not None or supersede_key is not None:
                parsed = mail_options(parsed, expires_in_s, supersede_key)
            if parsed.in_reply_to is not None:
                parsed = await joined_thread(self._reader, context.session_id, parsed)
        except Rejected as rejection:
            return tool.error_result(rejection.code.value, rejection.message)
        refusal = await self._permissions.gate(context, parsed)
        if refusal is not None:
            return refusal
        # A message continues the trace of the one that caused it: a conversation is one trace.
        cause = await self._reader.cause_traceparent(context.session_id, context.run_id)
        with tracing.span("treemail.prepare", cause, sender_session_id=context.session_id, run_id=context.run_id):
            outcome = await self._approvals.request(context, parsed)
        if "ok" in outcome:
            return outcome["ok"]
        return outcome

    async def _urgent_send(self, context: SendContext) -> bool:
        record = await self._reader.find(context.session_id)
        return record is not None and c.URGENT_SEND in (await self._reader.state(record)).installed_tools

    async def for_model(self, context: SendContext, arguments) -> ToolResult:
        """``send_message`` with the one-line text a model reads as the tool result (``tool.result_text``)."""
        result = await self.send_message(context, arguments)
        return ToolResult(result, tool.result_text(result), "error" in result)

    async def host_send(self, sender_session_id: str, to: str, body: str, *, mode: str = "steer",
                        idempotency_key: str | None = None, run_id: str | None = None, urgent: bool = False,
                        expires_in_s: float | None = None, supersede_key: str | None = None) -> dict:
        """A programmatic send by the host under its own idempotency key (``Treemail.send``)."""
        context = await host_context(self._reader, sender_session_id, idempotency_key, run_id)
        return await self.send_message(context, {"to": to, "body": body, "mode": mode}, urgent=urgent,
                                       expires_in_s=expires_in_s, supersede_key=supersede_key, numbered=True)
