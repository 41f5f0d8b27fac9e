"""The host API of peer routes (seed 004 part 2), mixed into ``Treemail``; and delivery that checks source proofs.

    await tm.register_peer_route("advisor", advisor.session_id, source_session_id=planner.session_id,
                                 input_schema={...})
    await tm.set_peer_grant(advisor.session_id, source_session_id=planner.session_id, send=True, context=True,
                            principal="acme/planner")
    await tm.peer_send_tool_definition(planner.session_id)     # None without a send grant
    await tm.send_to_peer(SendContext(planner.session_id, run_id, tool_call_id), {"peer": "advisor", "body": ...})

Every tool call here never raises for model input: a result or
``{"error": {"code", "message"}}``. Identity (session, run, tool call) comes
from the host's context; the model names only a peer.

A little over the house's 200 lines: the host's peer-route surface (registration, grants, tools,
claim-time proof checks) stays together.
"""

from datetime import datetime, timezone

from redis.exceptions import RedisError

from treemail.adapters import keys
from treemail.adapters.proofkeys import load_keyring
from treemail.adapters.proofmetrics import PROOF_FAILURES
from treemail.domain import events as ev
from treemail.domain import peers, proof, protocol
from treemail.domain.commands import SendContext, SendToPeer
from treemail.domain.errors import Code, Rejected, UnknownSessionError
from treemail.domain.peer_envelope import render_peer_message
from treemail.domain.records import SessionRecord
from treemail.domain.results import error_result
from treemail.services.peers import PeerService

from treemail.producers.tools import peer as peer_tools
from treemail.producers.tools.answering import answered

# A claimed entry a newer protocol wrote (``_read_claimed``): neither judged nor delivered by this version.
NEWER = object()


class PeerHost:
    def _init_peers(self) -> None:
        # Loaded once: a bad key file fails at connect, not at the first delivery.
        self.keyring = load_keyring(self.config.proof)
        self.peer_service = PeerService(self.store, self.sessions, self.config.messaging, self.keyring)

    # ---- the host's routes and grants -------------------------------------------------------------------

    async def register_peer_route(self, name: str, target_session_id: str, *, source_session_id: str | None = None,
                                  source_agent_type: str | None = None, description: str | None = None,
                                  input_schema: dict | None = None) -> None:
        """``source_session_id`` (one session) or ``source_agent_type`` (every session of that type) may
        address ``target_session_id``, in any tree, as ``name``. ``description`` defaults to the target's."""
        await self.peer_service.register_route(
            name, target_session_id, source_session_id=source_session_id, source_agent_type=source_agent_type,
            description=description, input_schema=input_schema,
        )

    async def revoke_peer_route(self, name: str, *, source_session_id: str | None = None,
                                source_agent_type: str | None = None) -> bool:
        return await self.peer_service.revoke_route(
            name, source_session_id=source_session_id, source_agent_type=source_agent_type
        )

    async def set_peer_grant(self, target_session_id: str, *, source_session_id: str | None = None,
                             source_agent_type: str | None = None, principal: str | None = None,
                             context: bool = False, read: bool = False, send: bool = False,
                             control: bool = False) -> str:
        """Replace what the source may do to the target; every operation not set is denied. Returns the principal."""
        return await self.peer_service.set_grant(
            target_session_id, source_session_id=source_session_id, source_agent_type=source_agent_type,
            principal=principal, context=context, read=read, send=send, control=control,
        )

    async def authorize_peer(self, source_session_id: str, target_session_id: str, operation: str):
        """context, read, send or control of one pair: ``Authorization(operation, allowed, principal)``.

        The hook for inspect (``read``) and retry (``control``) of mail sent to a peer.
        """
        return await self.peer_service.authorize(source_session_id, target_session_id, operation)

    async def peer_routes(self, session_id: str) -> list[dict]:
        """The session's peer names that lead somewhere, with what each grant allows."""
        views = await self.peer_service.views(await self.sessions.record(session_id))
        return [{"name": v.name, "target_session_id": v.target.session_id, "principal": v.grant.principal
                 if v.grant else None, **{op: v.allows(op) for op in peers.OPERATIONS}} for v in views]

    # ---- the tools, one by one ------------------------------------------------------------------------------

    async def peer_send_tool_definition(self, session_id: str) -> dict | None:
        return peer_tools.send_definition(await self.peer_service.views(await self.sessions.record(session_id)))

    async def peer_reply_tool_definition(self, session_id: str) -> dict | None:
        return peer_tools.reply_definition(await self.peer_service.views(await self.sessions.record(session_id)))

    async def peer_inbox_tool_definition(self, session_id: str) -> dict | None:
        record = await self.sessions.record(session_id)
        return peer_tools.inbox_definition(peers.receives((await self.store.load(record)).state.peers))

    async def send_to_peer(self, context: SendContext, arguments) -> dict:
        """``{"message_id", "peer", "mode"}`` (and ``recipient_state`` with a read grant), or an error."""
        return await self._peer_call(context, arguments, peer_tools.parse_send)

    async def reply_to_peer(self, context: SendContext, arguments) -> dict:
        """Like send_to_peer, for one of the session's actual inbound references from that peer."""
        return await self._peer_call(context, arguments, peer_tools.parse_reply)

    async def _peer_call(self, context: SendContext, arguments, parse) -> dict:
        return await answered(lambda: self.peer_service.send(SendToPeer(context, parse(arguments))),
                              Code.PEER_ENGINE_SHUTDOWN)

    async def peer_inbox(self, context: SendContext, arguments=None) -> dict:
        """The calling session's latest peer mail with its provenance, newest first."""
        try:
            limit = peer_tools.parse_inbox(arguments)
            entries, back = await self.peer_service.inbox(await self.sessions.record(context.session_id))
        except Rejected as rejection:
            return error_result(rejection.code.value, rejection.message)
        except UnknownSessionError:
            return error_result(Code.UNKNOWN_SESSION.value, "the calling session is not registered with treemail")
        except RedisError as error:
            return error_result(Code.PEER_ENGINE_SHUTDOWN.value, f"the inbox could not be read ({type(error).__name__})")
        return {"messages": [{
            "message_id": e.message_id, "sender": e.sender_handle, "sender_session_id": e.sender_session_id,
            "principal": e.principal, "at": datetime.fromtimestamp(e.at, timezone.utc).isoformat(timespec="seconds"),
            "in_reply_to": e.in_reply_to, "reply_peer": back.get(e.sender_session_id),
        } for e in entries[:limit]]}

    # ---- delivery: only what its proof vouches for ---------------------------------------------------------

    async def _read_claimed(self, record: SessionRecord, seqs: list[int]) -> dict[int, ev.Event | None]:
        """The accepted events at these positions; None where an entry is gone or no longer reads as an event."""
        stream = keys.session_stream(record.partition, record.session_id)
        async with self.redis.pipeline(transaction=False) as pipe:
            for seq in seqs:
                pipe.xrange(stream, min=f"{seq}-0", max=f"{seq}-0")
            replies = await pipe.execute()
        found: dict[int, ev.Event | None] = {}
        for seq, entries in zip(seqs, replies):
            try:
                [(_, fields)] = entries
                if protocol.is_newer(protocol.version_of(fields.get(b"v"))):
                    # A newer treemail wrote it: not this version's to judge; it stays claimed, undelivered.
                    found[seq] = NEWER
                    continue
                event = ev.decode(fields[b"type"].decode(), fields[b"data"])
            except (ValueError, KeyError, UnicodeDecodeError):
                event = None
            found[seq] = event if isinstance(event, ev.ProducerMessageAccepted) else None
        return found

    def _verdict(self, record: SessionRecord, message_id: str, event) -> str:
        if event is None:
            return "unreadable"
        if event.owner != "agent" or self.keyring is None:
            return "unchecked"
        if event.message_id != message_id:
            return "mismatch"
        return proof.verify(event, record.session_id, self.keyring)

    async def _deliver_claimed(self, record: SessionRecord, claimed: list[tuple[str, ev.Event | None]],
                               reply_hint: bool) -> list:
        """Deliveries of the claimed mail in order; a message whose proof fails is set aside and counted."""
        deliveries, back = [], None
        for message_id, event in claimed:
            if event is NEWER:
                continue
            verdict = self._verdict(record, message_id, event)
            if verdict not in ("ok", "unchecked"):
                PROOF_FAILURES.labels(reason=verdict).inc()
                # Discarded, never delivered: the history keeps the entry and why it was refused.
                await self.discard(record.session_id, message_id, f"source_proof_{verdict}")
                continue
            verified = verdict == "ok"
            if event.principal is not None:
                if back is None:
                    back = (await self.peer_service.inbox(record))[1]
                text = render_peer_message(event.sender_handle or event.sender_session_id or "", event.principal,
                                           event.message_id, event.body, back.get(event.sender_session_id))
                deliveries.append(self._deliver(event, False, text=text, verified=verified))
            elif reply_hint and self.config.messaging.routing == "direct":
                # The recipient sees the tool, yet direct routing may not let it answer this sender.
                deliveries.append(self._deliver(event, await self._may_reply(record, event), verified=verified))
            else:
                deliveries.append(self._deliver(event, reply_hint, verified=verified))
        return deliveries


# ---- the tool registry's rows (``producers/tools.py``): definition builders and handlers ----------------

async def send_definition(host, record: SessionRecord) -> dict | None:
    return await host.peer_send_tool_definition(record.session_id)


async def reply_definition(host, record: SessionRecord) -> dict | None:
    return await host.peer_reply_tool_definition(record.session_id)


async def inbox_definition(host, record: SessionRecord) -> dict | None:
    return await host.peer_inbox_tool_definition(record.session_id)


async def call_send(host, context: SendContext, arguments) -> dict:
    return await host.send_to_peer(context, arguments)


async def call_reply(host, context: SendContext, arguments) -> dict:
    return await host.reply_to_peer(context, arguments)


async def call_inbox(host, context: SendContext, arguments) -> dict:
    return await host.peer_inbox(context, arguments)
