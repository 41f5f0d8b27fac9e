"""One call for a whole subtree (``tm.peers.broadcast_subtree``, ``tm.disposal.stop_subtree``): a broadcast to every descendant, a cascading stop.

A broadcast is recorded on the sender's stream with its recipients fixed at
that moment (the descendants the tree index knows when it is decided; a
session attached later gets no copy, also when the broadcast is resumed), then
every copy is an ordinary send from the sender's open run through the worker
pool, under every guard and permission, keyed by the broadcast and the
recipient: the same call again (same key) resumes a broadcast a crash
interrupted without sending any copy twice. Refusals are per recipient.

A cascading stop interrupts or disposes the subtree bottom-up: every session
after all of its descendants (deepest level first, the top last), so each
settlement notice reaches a parent that is still there, leaves first. A
cascading disposal closes the subtree for good: every session is sealed first
(no child registers under it any more, and no mail resumes it), then disposed.
"""

import asyncio

from treemail.domain import limits
from treemail.domain.commands import SendContext
from treemail.domain.decide import subtree
from treemail.domain.decide.guards import require_body
from treemail.domain.errors import Code, Rejected
from treemail.services.disposal import DisposalService
from treemail.services.settlement import check_closing_text, check_stop_reason
from treemail.services.subtree import SubtreeService

from ..tools import subtree as subtree_tool
from ..tools.answering import answered
from .hostcall import host_context
from .sending import Sending
from .shared import Part, Shared

# Copies in flight at once: enough to keep a worker pool busy, few enough not to flood the command stream.
FAN_OUT = 32


def accounted(recipients, results: list[dict], records: dict) -> tuple[list[dict], list[dict]]:
    """(delivered, refused): every recipient in exactly one of them, a refusal with its code. An answer that
    names neither a message nor an error (none should) is a refusal, never a recipient left out of both."""
    delivered, refused = [], []
    for recipient, result in zip(recipients, results, strict=True):
        record = records.get(recipient)
        handle = record.handle if record is not None else None
        error = result.get("error") if isinstance(result, dict) else None
        message_id = result.get("message_id") if isinstance(result, dict) and error is None else None
        if message_id is not None:
            delivered.append({"session_id": recipient, "handle": handle, "message_id": message_id,
                              "recipient_state": result.get("recipient_state")})
        elif error is not None and error.get("code"):
            refused.append({"session_id": recipient, "handle": handle, **error})
        else:
            refused.append({"session_id": recipient, "handle": handle, "code": Code.SUBTREE_ENGINE_SHUTDOWN.value,
                            "message": "the copy got no answer that names a message or a refusal; broadcast "
                                       "again with the same call to resume it"})
    return delivered, refused


class Subtree(Part):
    def __init__(self, shared: Shared, service: SubtreeService, disposal: DisposalService, sending: Sending) -> None:
        super().__init__(shared)
        self._service = service
        self._disposal = disposal
        self._sending = sending

    # ---- broadcast ----------------------------------------------------------------------------------

    async def broadcast(self, session_id: str, body: str, *, mode: str = "steer", idempotency_key: str | None = None,
                        run_id: str | None = None) -> dict:
        """Send ``body`` from this session's open run (or ``run_id``) to every session below it.

        ``{"result": "broadcast", "broadcast_id", "recipients", "delivered": [{"session_id", "handle",
        "message_id", "recipient_state"}], "refused": [{"session_id", "handle", "code", "message"}],
        "message"}``, or ``{"error": {"code", "message"}}`` with nothing sent. The same
        ``idempotency_key`` (for this sender and run) resumes the first broadcast, to its recipients.
        """
        context = await host_context(self._reader, session_id, idempotency_key, run_id)
        return await self.message_subtree(context, {"body": body, "mode": mode})

    async def message_subtree(self, context: SendContext, arguments) -> dict:
        """A model's message_subtree call (or the host's broadcast); like send_message it never raises for
        model input. Idempotent per tool call."""
        return await answered(lambda: self._broadcast(context, arguments), Code.SUBTREE_ENGINE_SHUTDOWN)

    async def _broadcast(self, context: SendContext, arguments) -> dict:
        body, mode = subtree_tool.parse_arguments(arguments)
        try:
            require_body(body, self._config.messaging.max_body_bytes)
        except UnicodeEncodeError:
            raise Rejected(Code.SUBTREE_INVALID_BODY, "body is not valid Unicode text (it contains a lone surrogate)")
        except Rejected as rejection:
            raise Rejected(Code.SUBTREE_INVALID_BODY, rejection.message) from None
        sender = await self._reader.find(context.session_id)
        if sender is None:
            raise Rejected(Code.SUBTREE_UNKNOWN_SESSION, "the broadcasting session is not registered with treemail")
        broadcast = await self._service.start_broadcast(sender, context.run_id, context.tool_call_id, body, mode)
        records = await self._reader.many(list(broadcast.recipients))
        gate = asyncio.Semaphore(FAN_OUT)

        async def copy(recipient: str) -> dict:
            async with gate:
                return await self._sending.send_message(
                    SendContext(sender.session_id, broadcast.run_id, subtree.copy_call(broadcast.broadcast_id, recipient)),
                    {"to": recipient, "body": body, "mode": mode},
                )

        results = await asyncio.gather(*(copy(r) for r in broadcast.recipients))
        delivered, refused = accounted(broadcast.recipients, results, records)
        await self._service.finish_broadcast(
            sender, broadcast, {d["session_id"]: d["message_id"] for d in delivered},
            {r["session_id"]: r["code"] for r in refused},
        )
        message = f"sent to {len(delivered)} of {len(broadcast.recipients)} agents below you"
        if refused:
            message += "; refused: " + ", ".join(f"{r['handle'] or r['session_id']} ({r['code']})" for r in refused)
        return {"result": "broadcast", "broadcast_id": broadcast.broadcast_id, "recipients": len(broadcast.recipients),
                "delivered": delivered, "refused": refused, "message": message}

    # ---- cascading stop ---------------------------------------------------------------------------------

    async def stop(self, session_id: str, how: str = "dispose", *, reason: str | None = "aborted",
                   closing_text: str | None = None, idempotency_key: str | None = None) -> list[dict]:
        """Interrupt or dispose this session and every session below it, bottom-up.

        ``how="dispose"``: each is disposed (``tm.disposal.dispose``) with ``reason``, children before their
        parent, so every parent gets its children's settlement notices, leaves first, before its own goes up.
        ``how="interrupt"``: each open run is interrupted (a trigger for the host runners, in the same order);
        a session with no run open is left as it is. Returns one row per session, in the order stopped:
        ``{"session_id", "handle", "settlement"}`` (dispose: the notice's gate) or ``{"session_id", "handle",
        "interrupted"}``. The same ``idempotency_key`` resumes an interrupted stop in its recorded order.
        """
        if how not in subtree.STOP_HOWS:
            raise limits.invalid(f"how must be interrupt or dispose, got {limits.shown(how)}")
        check_stop_reason(reason)
        closing_text = check_closing_text(closing_text)
        limits.require_text("idempotency_key", idempotency_key, limits.MAX_IDEMPOTENCY_KEY_BYTES, optional=True)
        top = await self._service.sessions.record(session_id)
        stop_id, order = await self._service.start_stop(top, how, reason, idempotency_key, closing_text)
        if how == "dispose":
            # Closed for good: sealed first, so no child joins the subtree while it is being disposed.
            order = await self._service.seal(top, stop_id, order)
        records = await self._reader.many(order)
        rows = []
        for sid in order:
            record = records[sid]
            if record is None:
                continue
            if how == "dispose":
                disposed = await self._disposal.dispose(sid, reason, closing_text)
                rows.append({"session_id": sid, "handle": record.handle, "settlement": disposed.settlement})
            else:
                interrupted = await self._service.interrupt(record, stop_id, top, reason or "")
                rows.append({"session_id": sid, "handle": record.handle, "interrupted": interrupted})
        return rows
