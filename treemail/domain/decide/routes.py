"""Peer routes: registering routes and grants, and deciding a send or a reply over one.

A send over a route is decided like tree mail, by the send's own pieces:
the same sender check (the exact live sender, drains and disposal
included), switch, body limit, hop, inbox and pair-window guards
(``send.admit``), the same accepted event (``send.accept``), the same commit
and the same idempotency key (the tool call). Only authorization differs:
instead of tree scope and relationship rules, the target must hold a route
from this sender under the peer name the model gave, and a ``send`` grant for
it, whose principal is recorded on the message. Routes and grants deny by
default. A reply additionally names one of the replier's actual inbound
references, whose sender must be the peer it replies to.
"""

import json
from dataclasses import dataclass, field

from .. import events as ev
from .. import digests, grants, peerinput, peers
from ..commands import PeerSendArguments, RegisterPeerRoute, RevokePeerRoute, SendToPeer, SetPeerGrant
from ..errors import Code, Rejected
from ..records import SessionRecord
from . import endings, guards, idempotency, send
from .guards import Found
from .lifecycle import Given, require_registered
from .send import Accepted, Refused, SendDecision, SendGiven


@dataclass(frozen=True)
class NoSuchPeer:
    """The sender has no route under this name (or its target is gone): the names it does have."""

    name: str
    available: list[str] = field(default_factory=list)


# ---- the host's registrations, on the target's stream ---------------------------------------------


def decide_register_route(command: RegisterPeerRoute, given: Given) -> list[ev.Event]:
    require_registered(given.state)
    schema = json.loads(command.input_schema) if command.input_schema else None
    key = peers.route_key(command.source_kind, command.source, command.name)
    wanted = peers.Route(command.source_kind, command.source, command.name, command.description, schema)
    if given.state.peers.routes.get(key) == wanted:
        return []
    return [ev.PeerRouteRegistered(
        at=given.now, source_kind=command.source_kind, source=command.source, name=command.name,
        description=command.description, input_schema=schema,
    )]


def decide_revoke_route(command: RevokePeerRoute, given: Given) -> list[ev.Event]:
    require_registered(given.state)
    if peers.route_key(command.source_kind, command.source, command.name) not in given.state.peers.routes:
        return []
    return [ev.PeerRouteRevoked(at=given.now, source_kind=command.source_kind, source=command.source,
                                name=command.name)]


def decide_set_grant(command: SetPeerGrant, given: Given) -> list[ev.Event]:
    require_registered(given.state)
    wanted = peers.Grant(command.principal, command.context, command.read, command.send, command.control)
    if given.state.peers.grants.get(peers.source_key(command.source_kind, command.source)) == wanted:
        return []
    return [ev.PeerGrantSet(
        at=given.now, source_kind=command.source_kind, source=command.source, principal=command.principal,
        context=command.context, read=command.read, send=command.send, control=command.control,
    )]


# ---- a send or a reply over a route ---------------------------------------------------------------


def require_peer(sender: SessionRecord, target, name: str) -> tuple[Found, peers.Route]:
    """The target and the route it holds from this sender under ``name``; unknown otherwise (deny by default)."""
    if isinstance(target, Found) and target.state.registered:
        route = peers.route_for(target.state.peers, sender.agent_type, sender.session_id, name)
        if route is not None:
            if target.record.session_id == sender.session_id:
                raise Rejected(Code.SELF_SEND, "you cannot send a message to yourself")
            return target, route
    available = target.available if isinstance(target, NoSuchPeer) else []
    listing = ", ".join(f"`{n}`" for n in available) or "none"
    raise Rejected(Code.PEER_UNKNOWN, f"you have no peer named `{name}`; your peers: {listing}")


def require_reference(sender_peers: peers.PeerState, reference: str | None, target: SessionRecord, name: str) -> None:
    """A reply answers a message the replier really received, and from the very peer it replies to."""
    entry = peers.inbound(sender_peers, reference) if reference else None
    if entry is None:
        raise Rejected(
            Code.PEER_UNKNOWN_REFERENCE,
            f"`message_id` {reference!r} is not a message in your peer inbox; reply only to a message_id "
            "your inbox lists",
        )
    if entry.sender_session_id != target.session_id:
        raise Rejected(
            Code.PEER_FOREIGN_REFERENCE,
            f"message {reference} was not sent by peer `{name}`; reply to it over the route to its sender",
        )


def decide_peer_send(command: SendToPeer, given: SendGiven) -> SendDecision:
    arguments, config = command.arguments, given.config
    try:
        sender = guards.require_sender(given.sender, given.sender_state)
        endings.require_sender_admitted(given.sender_state, command.context.run_id, given.service_draining)
        guards.require_enabled(config)
        guards.require_body(arguments.body, config.max_body_bytes)
        found, route = require_peer(sender, given.target, arguments.peer)
        endings.require_recipient_admitting(found)
        principal = grants.require(found.state.peers, sender.agent_type, sender.session_id, "send", arguments.peer)
        if arguments.reply:
            require_reference(given.sender_state.peers, arguments.in_reply_to, found.record, arguments.peer)
        peerinput.require_input(route.input_schema, arguments.body, arguments.peer)
        hop = send.admit(given, sender, found, command.context.run_id)
    except Rejected as rejection:
        return Refused(rejection.code, rejection.message)
    accepted = send.accept(
        command, given, sender, found, hop,
        principal=principal, peer=arguments.peer, in_reply_to=arguments.in_reply_to, reply=arguments.reply,
    )
    result = {"message_id": given.new_id, "peer": arguments.peer, "mode": arguments.mode}
    if arguments.reply:
        result["in_reply_to"] = arguments.in_reply_to
    if grants.authorize(found.state.peers, sender.agent_type, sender.session_id, "read").allowed:
        # The recipient's state is the target's to show: only a `read` grant reveals it.
        result["recipient_state"] = accepted.result["recipient_state"]
    return Accepted(accepted.events, result)


# ---- idempotency: the tool call, as for tree mail -------------------------------------------------

CONFLICT_MESSAGE = (
    "this tool call was already used to send a peer message with different arguments; make a new tool call "
    "to send another message"
)


def fingerprint(arguments: PeerSendArguments) -> str:
    return digests.digest([arguments.peer, arguments.body, arguments.mode, arguments.in_reply_to, arguments.reply])


PEER_SENDS = idempotency.Keyed(fingerprint, Code.PEER_IDEMPOTENCY_CONFLICT, CONFLICT_MESSAGE)
record = PEER_SENDS.record
replayed_outcome = PEER_SENDS.replayed_outcome
