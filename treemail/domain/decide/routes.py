"""Peer routes: registering routes and grants, and deciding a send or a reply over one.

A send over a route is an intent stored on the sender's own stream
(``decide_peer_send``): the same sender check as tree mail (the exact live
sender, drains and disposal included), switch, body limit, hop and the
per-source capacity, with the tool call as idempotency key. Authorization
differs from tree mail: the target must hold a route from this sender under
the peer name the model gave, and a ``send`` grant for it, whose principal
is recorded on the message; routes and grants deny by default. A reply is
authorized on its own: it names one of the replier's actual inbound
references, whose recorded sender must be the peer it replies to. A driver
then admits the intent to the target (``peerdelivery``). A ping-pong with no new content is refused as
on tree mail (``loops``), without the ancestor's notice: peers in two trees share no ancestor.
"""

import json
from dataclasses import dataclass, field

from .. import events as ev
from .. import digests, grants, peerinput, peers
from .. import loops as loop_causes
from ..commands import PeerSendArguments, RegisterPeerRoute, RevokePeerRoute, SendToPeer, SetPeerGrant
from ..errors import Code, Rejected
from ..records import SessionRecord
from . import backpressure, endings, guards, idempotency
from . import loops as loop_guard
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


def require_reference(sender_peers: peers.PeerState, reference: str | None, target: SessionRecord, name: str
                      ) -> peers.InboxEntry:
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
    return entry


def decide_peer_send(command: SendToPeer, given: SendGiven) -> SendDecision:
    """The intent, on the source's stream: it is pending from here, and a driver admits it to the destination.

    The sender alone is checked exactly (its live run, drains, disposal, its capacity, its outbox, its inbox
    for a reply), for the step is committed on its own stream under its etag. What the destination holds
    (the route, the grant, the input schema, its disposal) is read just before and refused early, and
    checked again by every admission attempt, on the destination's stream, under its etag."""
    arguments, config = command.arguments, given.config
    try:
        sender = guards.require_sender(given.sender, given.sender_state)
        endings.require_sender_admitted(given.sender_state, command.context.run_id, given.service_draining)
        guards.require_enabled(config)
        guards.require_body(arguments.body, config.max_body_bytes)
        found, route = require_peer(sender, given.target, arguments.peer)
        endings.require_recipient_admitting(found)
        if arguments.reply:
            # A reply is its own decision: the recorded sender of a message the replier really received
            # must be the peer it answers; no send grant is asked, and none is conferred by it.
            require_reference(given.sender_state.peers, arguments.in_reply_to, found.record, arguments.peer)
            granted = grants.grant_for(found.state.peers, sender.agent_type, sender.session_id)
            principal = granted.principal if granted is not None else peers.source_key("session", sender.session_id)
        else:
            principal = grants.require(found.state.peers, sender.agent_type, sender.session_id, "send",
                                       arguments.peer)
        peerinput.require_input(route.input_schema, arguments.body, arguments.peer)
        hop = guards.sending_hop(given.sender_state, command.context.run_id)
        guards.require_hops(hop, config)
        guards.require_source_capacity(given.sender_state, config)
        require_outbox_room(given.sender_state, config)
        # A ping-pong over a route is refused as one over tree mail is: refused early here on the state read,
        # and again at every admission on the destination's state as committed.
        loop_guard.require_no_loop(sender, given.sender_state, found, command.context.run_id, arguments.body)
    except Rejected as rejection:
        message, pressure = backpressure.explain(rejection, given)  # flow control: when to retry, and why
        return Refused(rejection.code, message, backpressure=pressure)
    caused_by, chain = loop_causes.cause_of(given.sender_state.run_causes, command.context.run_id)
    intent = ev.PeerIntentStored(
        at=given.now, message_id=given.new_id, destination_session_id=found.record.session_id,
        peer=arguments.peer, principal=principal, body=arguments.body, mode=arguments.mode, agent_hop=hop,
        run_id=command.context.run_id, tool_call_id=command.context.tool_call_id,
        in_reply_to=arguments.in_reply_to, reply=arguments.reply,
        traceparent=getattr(command, "traceparent", "") or None, code_version=config.peer_code_version or None,
        caused_by=caused_by, chain_id=chain or given.new_id,
    )
    result = {"message_id": given.new_id, "peer": arguments.peer, "mode": arguments.mode, "status": "pending"}
    if arguments.reply:
        result["in_reply_to"] = arguments.in_reply_to
    return Accepted([intent], result)


def require_outbox_room(state, config) -> None:
    """The source's delivery rows are bounded each on its own: pending (not yet admitted) and retained
    (admitted, awaiting their settlement)."""
    rows = state.outbox.values()
    retained = sum(row.status == "accepted" for row in rows)
    if len(state.outbox) - retained >= config.max_pending_peer_deliveries:
        raise Rejected(Code.PEER_OUTBOX_FULL, f"you already have {len(state.outbox) - retained} peer messages "
                       f"waiting to be delivered (limit {config.max_pending_peer_deliveries}); wait for them or "
                       "inspect them before sending more")
    if retained >= config.max_retained_peer_deliveries:
        raise Rejected(Code.PEER_OUTBOX_FULL, f"you already have {retained} delivered peer messages their "
                       f"recipients have not processed (limit {config.max_retained_peer_deliveries}); wait for "
                       "them before sending more")


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
