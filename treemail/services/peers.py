"""Peer routes in the host process: register routes and grants, store sends and replies over them.

A peer send crosses slots (its target may be in another tree, so another
partition), so it is never one atomic step. It is decided here on the
sender's state and what the target holds, and stored as an intent on the
sender's own stream (``PeerIntentStored``), under the sender's etag, with
the tool call's idempotency record: the exact live sender, its capacity
(tree mail and peer intents together) and its outbox bounds are checked in
that step. A driver (``peerdelivery``) then admits it to the target.
"""

import json
from dataclasses import dataclass, replace

from ..adapters import keys, tracing
from .tracecause import cause_traceparent
from ..adapters.eventstore import EventStore
from ..adapters.peerdue import PeerDue
from ..adapters.peerindex import PeerIndex
from ..domain import grants, ids, limits, peerinput, peers, proof
from ..domain.commands import RegisterPeerRoute, RevokePeerRoute, SendToPeer, SetPeerGrant
from ..domain.decide import idempotency, routes
from ..domain.decide.guards import Found
from ..domain.decide.send import Refused, SendGiven, outcome_of
from ..domain.errors import InvalidRequest, LifecycleError, UnknownSessionError
from ..domain.handlers import HANDLERS
from ..domain.messaging import MessagingConfig
from ..domain.records import SessionRecord
from ..domain.state import SessionState
from . import servicedrain
from .clock import SYSTEM_CLOCK, Clock
from .keyedcalls import keyed_write, transact_keyed
from .transaction import Write
from .sessions import SessionService

# A route the host asks for that no peer route may be: its target is a delegated child, or its own source.
DELEGATED_CHILD = "peer_route:delegated_child"
SELF_ROUTE = "peer_route:self"

decide_peer_send = HANDLERS[SendToPeer].decide


@dataclass(frozen=True)
class PeerView:
    """One of a sender's peer names as its target holds it: the route, the grant, and the target's status."""

    name: str
    target: SessionRecord
    route: peers.Route
    grant: peers.Grant | None
    status: str

    def allows(self, operation: str) -> bool:
        return self.grant is not None and self.grant.allows(operation)


def _source(source_session_id: str | None, source_agent_type: str | None) -> tuple[str, str]:
    if (source_session_id is None) == (source_agent_type is None):
        raise limits.IdentifierError(limits.INVALID, "name exactly one source: source_session_id or source_agent_type")
    if source_session_id is not None:
        return "session", limits.require_id("source_session_id", source_session_id)
    return "agent_type", limits.require_name("source_agent_type", source_agent_type)


def _peer_name(name) -> str:
    """A route's name, checked before anything is read or stored (the index is written before the route)."""
    limits.require_name("name", name)
    if not peers.NAME_PATTERN.match(name):
        raise limits.IdentifierError(limits.INVALID, "a peer name is a lower-case letter, then letters, digits, "
                                                     "'_' or '-' (at most 64)")
    return name


class PeerService:
    def __init__(self, store: EventStore, sessions: SessionService, config: MessagingConfig,
                 keyring: proof.Keyring | None, clock: Clock = SYSTEM_CLOCK) -> None:
        self.store = store
        self.sessions = sessions
        self.config = config
        self.keyring = keyring
        self.clock = clock
        self.index = PeerIndex(store.redis)
        self.due = PeerDue(store.redis)

    # ---- the host's registrations ----------------------------------------------------------------

    async def register_route(self, name: str, target_session_id: str, *, source_session_id: str | None = None,
                             source_agent_type: str | None = None, description: str | None = None,
                             input_schema: dict | None = None) -> None:
        kind, source = _source(source_session_id, source_agent_type)
        _peer_name(name)
        limits.require_id("target_session_id", target_session_id)
        limits.require_text("description", description, limits.MAX_DESCRIPTION_BYTES, optional=True, empty=True)
        schema = json.dumps(peerinput.check_schema(input_schema)) if input_schema is not None else ""
        limits.require_text("input_schema", schema, limits.FIELD_LIMITS["input_schema"], empty=True)
        target = await self.sessions.record(target_session_id)
        if target.parent_session_id is not None:
            # Peers are independent agents. A delegated child is its parent's worker; a route
            # to it would bypass the parent's admission and budget, so it is reached by tree mail only.
            raise InvalidRequest(DELEGATED_CHILD, f"session {target_session_id} is a delegated child; a peer route "
                                                  "may only lead to the root of a tree (an independent agent)")
        if kind == "session":
            await self.sessions.record(source)
            if source == target_session_id:
                raise InvalidRequest(SELF_ROUTE, "a session cannot have a peer route to itself")
        previous = await self.index.get(kind, source, name)
        # The index first: a route event it does not lead to yet would only go unused, never misused.
        await self.index.put(kind, source, name, target_session_id)
        await self.sessions.execute(RegisterPeerRoute(
            target_session_id, kind, source, name,
            target.description if description is None else description, schema,
        ))
        if previous is not None and previous != target_session_id:
            await self._revoke_at(previous, kind, source, name)

    async def revoke_route(self, name: str, *, source_session_id: str | None = None,
                           source_agent_type: str | None = None) -> bool:
        """False when no such route was registered."""
        kind, source = _source(source_session_id, source_agent_type)
        _peer_name(name)
        target_session_id = await self.index.get(kind, source, name)
        if target_session_id is None:
            return False
        await self._revoke_at(target_session_id, kind, source, name)
        await self.index.remove_if(kind, source, name, target_session_id)
        return True

    async def _revoke_at(self, target_session_id: str, kind: str, source: str, name: str) -> None:
        try:
            await self.sessions.execute(RevokePeerRoute(target_session_id, kind, source, name))
        except (UnknownSessionError, LifecycleError):
            pass  # no such target any more: nothing holds the route

    async def set_grant(self, target_session_id: str, *, source_session_id: str | None = None,
                        source_agent_type: str | None = None, principal: str | None = None, context: bool = False,
                        read: bool = False, send: bool = False, control: bool = False) -> str:
        """Replace the pair's grant whole; returns its principal (by default the source's own name)."""
        kind, source = _source(source_session_id, source_agent_type)
        principal = principal if principal is not None else peers.source_key(kind, source)
        limits.require_name("principal", principal)
        if not principal.strip():
            raise limits.IdentifierError(limits.INVALID, "principal must not be blank")
        limits.require_id("target_session_id", target_session_id)
        for operation, allowed in (("context", context), ("read", read), ("send", send), ("control", control)):
            if not isinstance(allowed, bool):
                raise limits.IdentifierError(limits.INVALID, f"{operation} must be true or false")
        await self.sessions.record(target_session_id)
        if kind == "session":
            await self.sessions.record(source)  # as a route's: a grant to no session is refused, not stored
        await self.sessions.execute(SetPeerGrant(target_session_id, kind, source, principal, context=context,
                                                 read=read, send=send, control=control))
        return principal

    # ---- what a sender sees --------------------------------------------------------------------------

    async def views(self, sender: SessionRecord) -> list[PeerView]:
        """The sender's peer names whose target still holds the route, in name order."""
        names = await self.index.routes_of(sender)
        records = await self.store.directory.many(sorted(set(names.values())))
        present = [r for r in records.values() if r is not None]
        loaded = await self.store.load_many(present)
        found = []
        for name in sorted(names):
            target = records.get(names[name])
            if target is None:
                continue
            state = loaded[target.session_id].state
            route = peers.route_for(state.peers, sender.agent_type, sender.session_id, name)
            if route is not None and state.registered:
                grant = grants.grant_for(state.peers, sender.agent_type, sender.session_id)
                found.append(PeerView(name, target, route, grant, state.status))
        return found

    async def authorize(self, source_session_id: str, target_session_id: str, operation: str) -> grants.Authorization:
        """The authorizer, for the peer tools and for inspect and retry: one operation of a (source, target) pair."""
        source = await self.sessions.record(source_session_id)
        target = await self.sessions.record(target_session_id)
        state = (await self.store.load(target)).state
        return grants.authorize(state.peers, source.agent_type, source.session_id, operation)

    async def inbox(self, record: SessionRecord) -> tuple[list[peers.InboxEntry], dict[str, str]]:
        """The session's peer inbox, newest first, and sender session -> the peer name it can reply to it by
        (any route back: a reply is authorized on its own, by the message it answers, not by a send grant)."""
        state = (await self.store.load(record)).state
        back = {v.target.session_id: v.name for v in await self.views(record)}
        return list(reversed(state.peers.inbox)), back

    async def holds_read(self, record: SessionRecord) -> bool:
        """Whether this session holds a ``read`` grant on any peer it has a route to."""
        return any(view.allows("read") for view in await self.views(record))

    async def readable(self, record: SessionRecord, senders: set[str]) -> set[str]:
        """The senders among ``senders`` on which this session holds a ``read`` grant (its inbox shows theirs)."""
        found = [r for r in (await self.store.directory.many(sorted(senders))).values() if r is not None]
        loaded = await self.store.load_many(found)
        return {r.session_id for r in found
                if grants.authorize(loaded[r.session_id].state.peers, record.agent_type, record.session_id,
                                    "read").allowed}

    # ---- a send or a reply ------------------------------------------------------------------------------

    async def send(self, command: SendToPeer) -> dict:
        """The outcome the model is answered: ``{"ok": result}`` (the intent, ``status: pending``) or
        ``{"error": ...}``; durable on return. The intent is one commit on the sender's own stream."""
        # Peer mail continues the trace of what caused it too, as tree mail does.
        cause = await cause_traceparent(self.store, command.context.session_id, command.context.run_id)
        with tracing.span("treemail.peer.prepare", cause, session_id=command.context.session_id,
                          peer=command.arguments.peer):
            current = tracing.traceparent()
            return await self._store_intent(replace(command, traceparent=current) if current else command)

    async def _store_intent(self, command: SendToPeer) -> dict:
        context, arguments = command.context, command.arguments
        sender = await self.store.directory.get(context.session_id)
        digest = idempotency.key_digest(context)  # the tool call, exactly as tree mail keys it
        if sender is not None:
            recorded = await self.store.recorded(sender, digest) or await self._recorded_before(sender, digest)
            if recorded is not None:
                # A retried tool call is answered first, whatever changed since (a route revoked or moved).
                return routes.replayed_outcome(recorded, arguments)
        target_id = await self.index.resolve(sender, arguments.peer) if sender is not None else None
        target_record = await self.store.directory.get(target_id) if target_id else None

        async def round_(_attempt: int) -> Write:
            present = [r for r in (sender, target_record) if r is not None]
            loaded = await self.store.load_many(present)
            if target_record is not None:
                target = Found(target_record, loaded[target_record.session_id].state)
            else:
                available = [v.name for v in await self.views(sender) if v.allows("send")] if sender else []
                target = routes.NoSuchPeer(arguments.peer, available)
            draining = await servicedrain.service_draining(self.store)
            given = SendGiven(
                sender=sender, sender_state=loaded[sender.session_id].state if sender else SessionState(),
                target=target, config=self.config, new_id=ids.uuid7(), now=self.clock.now(),
                service_draining=draining, keyring=self.keyring,
            )
            decision = decide_peer_send(command, given)
            if isinstance(decision, Refused) and (sender is None or not idempotency.answers_retries(decision.code)):
                return Write(outcome_of(decision))
            decided_at.append(given.now)
            if not isinstance(decision, Refused):
                # Before the commit and after it: a driver that finds the outbox empty meanwhile cannot
                # take the source out of the index for good (``peerdue``).
                await self.due.touch(sender, given.now)
            return keyed_write(
                routes.PEER_SENDS, arguments, digest, sender, loaded[sender.session_id],
                decision, policy=self.config, now=given.now, read_draining=draining,
            )

        # When the round whose write answered was decided: the source is due from then.
        decided_at: list[float] = []
        answer = await transact_keyed(self.store, context.session_id, routes.PEER_SENDS, arguments, round_)
        if "ok" in answer:
            await self.due.touch(sender, decided_at[-1])
        return answer

    async def _recorded_before(self, sender: SessionRecord, digest: str) -> list | dict | None:
        """A tool call a release before the outbox decided: its record is with the target it was committed on."""
        first = await self.store.redis.get(keys.peer_intent(sender.partition, digest))
        target = await self.store.directory.get(first.decode()) if first else None
        if target is None:
            return None
        return await self.store.recorded(target, digest)
