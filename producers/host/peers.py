"""``tm.peers``: peer routes between sessions of any tree, their grants and the three peer tools; and a
broadcast to every session below one in its own tree (``broadcast_subtree``).

    await tm.peers.register_route("advisor", advisor.session_id, source_session_id=planner.session_id,
                                  input_schema={...})
    await tm.peers.set_grant(advisor.session_id, source_session_id=planner.session_id, send=True, context=True,
                             principal="acme/planner")
    await tm.peers.send_tool_definition(planner.session_id)     # None without a send grant
    await tm.peers.send(SendContext(planner.session_id, run_id, tool_call_id), {"peer": "advisor", "body": ...})

Every tool call here never raises for model input: a result or
``{"error": {"code", "message"}}``. Identity (session, run, tool call) comes
from the host's context; the model names only a peer.
"""

from treemail.adapters.faults import StoreError
from treemail.domain import peers
from treemail.domain.commands import SendContext, SendToPeer
from treemail.domain.errors import Code, Rejected, UnknownSessionError
from treemail.domain.results import error_result
from treemail.services.peerdelivery import PeerDriver
from treemail.services.peers import PeerService

from ..tools import peer as peer_tools
from ..tools import table
from ..tools.answering import answered

from .hostcall import require_context
from .shared import Part, Shared
from .subtree import Subtree


class Peers(Part):
    def __init__(self, shared: Shared, service: PeerService, driver: PeerDriver | None = None,
                 subtree: Subtree | None = None) -> None:
        super().__init__(shared)
        self._service = service
        self._driver = driver
        self._subtree = subtree

    # ---- whole subtrees: one message to every tree peer below a session ---------------------------------

    async def broadcast_subtree(self, session_id: str, body: str, *, mode: str = "steer",
                                idempotency_key: str | None = None, run_id: str | None = None) -> dict:
        """Send ``body`` from this session's open run to every session below it (those the tree index knows
        now), each copy an ordinary message under every guard; refusals are per recipient. The same
        ``idempotency_key`` resumes an interrupted broadcast without a duplicate. See ``Subtree.broadcast``."""
        return await self._subtree.broadcast(session_id, body, mode=mode, idempotency_key=idempotency_key,
                                             run_id=run_id)

    # ---- the host's routes and grants -------------------------------------------------------------------

    async def register_route(self, name: str, target_session_id: str, *, source_session_id: str | None = None,
                                  source_agent_type: str | None = None, description: str | None = None,
                                  input_schema: dict | None = None) -> None:
        """``source_session_id`` (one session) or ``source_agent_type`` (every session of that type) may
        address ``target_session_id``, in any tree, as ``name``. ``description`` defaults to the target's."""
        await self._service.register_route(
            name, target_session_id, source_session_id=source_session_id, source_agent_type=source_agent_type,
            description=description, input_schema=input_schema,
        )

    async def revoke_route(self, name: str, *, source_session_id: str | None = None,
                                source_agent_type: str | None = None) -> bool:
        return await self._service.revoke_route(
            name, source_session_id=source_session_id, source_agent_type=source_agent_type
        )

    async def set_grant(self, target_session_id: str, *, source_session_id: str | None = None,
                             source_agent_type: str | None = None, principal: str | None = None,
                             context: bool = False, read: bool = False, send: bool = False,
                             control: bool = False) -> str:
        """Replace what the source may do to the target; every operation not set is denied. Returns the principal."""
        return await self._service.set_grant(
            target_session_id, source_session_id=source_session_id, source_agent_type=source_agent_type,
            principal=principal, context=context, read=read, send=send, control=control,
        )

    async def authorize(self, source_session_id: str, target_session_id: str, operation: str):
        """context, read, send or control of one pair: ``Authorization(operation, allowed, principal)``.

        The hook for inspect (``read``) and retry (``control``) of mail sent to a peer.
        """
        return await self._service.authorize(source_session_id, target_session_id, operation)

    async def routes(self, session_id: str) -> list[dict]:
        """The session's peer names that lead somewhere, with what each grant allows."""
        views = await self._service.views(await self._reader.record(session_id))
        return [{"name": v.name, "target_session_id": v.target.session_id, "principal": v.grant.principal
                 if v.grant else None, **{op: v.allows(op) for op in peers.OPERATIONS}} for v in views]

    # ---- the tools, one by one ------------------------------------------------------------------------------

    async def send_tool_definition(self, session_id: str) -> dict | None:
        return await self._definition("send_to_peer", session_id)

    async def reply_tool_definition(self, session_id: str) -> dict | None:
        return await self._definition("reply_to_peer", session_id)

    async def inbox_tool_definition(self, session_id: str) -> dict | None:
        return await self._definition("peer_inbox", session_id)

    async def _definition(self, name: str, session_id: str) -> dict | None:
        """What the tool is for the session as its grants stand, whether or not the host installed it."""
        return await table.definition(name, await self._views.read(session_id), installed=False)

    async def send(self, context: SendContext, arguments) -> dict:
        """``{"message_id", "peer", "mode", "status": "pending"}`` once the intent is stored, or an error.

        ``status`` is the delivery's when it was stored; ``tm.obligations.inspect(message_id)`` reads it later
        (accepted with the destination's receipt, processed, refused, parked)."""
        return await self._peer_call(context, arguments, peer_tools.parse_send)

    async def reply(self, context: SendContext, arguments) -> dict:
        """Like send, for one of the session's actual inbound references from that peer."""
        return await self._peer_call(context, arguments, peer_tools.parse_reply)

    async def _peer_call(self, context: SendContext, arguments, parse) -> dict:
        require_context(context)
        result = await answered(lambda: self._service.send(SendToPeer(context, parse(arguments))),
                                Code.PEER_ENGINE_SHUTDOWN)
        if self._driver is not None and self._service.config.peer_admit_inline and result.get("status") == "pending":
            await self.deliver(context.session_id, result["message_id"])
        return result

    async def discard(self, source_session_id: str, message_id: str, reason: str = "") -> None:
        """Give up on a parked peer delivery of ``source_session_id``: it becomes processed (discarded, with
        ``reason``) and frees its capacity. LifecycleError (``retry_message:not_parked``/``:settled``) for one
        that is not parked."""
        await self._driver.discard(await self._reader.record(source_session_id), message_id, reason)

    async def deliver(self, source_session_id: str, message_id: str | None = None) -> None:
        """Drive the source's peer deliveries now, as the pump would (``message_id``: only that one): the
        host makes each send's first admission attempt itself. A failure here is the pump's to retry."""
        try:
            await self._driver.drive(await self._reader.record(source_session_id), only=message_id)
        except (StoreError, UnknownSessionError):
            pass

    async def inbox(self, context: SendContext, arguments=None) -> dict:
        """The calling session's peer mail, newest first, a page at a time (``next_cursor`` when more remain):
        with its provenance from senders it holds a ``read`` grant on; an entry from any other sender shows only
        its id, arrival and ``peer_message:not_granted``. A cursor stays valid while mail arrives: following it
        reaches every entry older than the page it came with, none twice. A caller that
        holds no read grant at all (from none of its inbox's senders, and on none of its routes) is refused
        (``peer_message:not_granted``), never shown an empty page it could take for an empty inbox."""
        require_context(context)
        try:
            limit, cursor = peer_tools.parse_inbox(arguments)
            record = await self._reader.record(context.session_id)
            entries, back = await self._service.inbox(record)
            readable = await self._service.readable(record, {e.sender_session_id for e in entries})
            if not readable and not await self._service.holds_read(record):
                return error_result(Code.PEER_NOT_GRANTED.value,
                                    "reading your peer inbox needs a read grant from a peer, and you hold none; "
                                    "nothing is shown")
        except Rejected as rejection:
            return error_result(rejection.code.value, rejection.message)
        except UnknownSessionError:
            return error_result(Code.UNKNOWN_SESSION.value, "the calling session is not registered with treemail")
        except StoreError as error:
            return error_result(Code.PEER_ENGINE_SHUTDOWN.value, f"the inbox could not be read ({type(error).__name__})")
        before = peer_tools.cursor_position(cursor)
        if cursor is not None and before is None:
            return error_result(Code.PEER_INVALID_ARGUMENTS.value,
                                "`cursor` is not a cursor of your inbox; call peer_inbox without it to start over")
        page, next_cursor = peers.page(entries, limit, before)
        return {"messages": [peer_tools.inbox_row(e, readable, back) for e in page],
                "next_cursor": peer_tools.cursor_of(next_cursor)}
