"""The peer side of a session: the routes and grants that lead to it, and its peer inbox. Pure.

Routes and grants are stored on the *target's* stream and folded into its
state. A send over a route is committed on that same stream with its etag,
so the route and the grant a send was decided on are exactly those in force
when it was appended: a revocation in between makes the commit conflict and
the send is decided again (and refused).

The inbox is the session's own record of peer mail it received (sender,
principal, reference, time), newest last and bounded: a reply may name only
one of these references.
"""

import re
from dataclasses import dataclass, field

from . import events as ev
from .frozen import replace

SOURCE_KINDS = ("session", "agent_type")
OPERATIONS = ("context", "read", "send", "control")
# Enough references for a model to answer the conversations it is in; the
# inbox rides in the state snapshot rewritten by every append, so it stays small.
INBOX_LIMIT = 32
NAME_PATTERN = re.compile(r"^[a-z][a-z0-9_-]{0,63}$")


def source_key(kind: str, source: str) -> str:
    return f"{kind}:{source}"


def route_key(kind: str, source: str, name: str) -> str:
    # A name never holds ":", so the key splits back at its last one.
    return f"{kind}:{source}:{name}"


@dataclass(frozen=True)
class Route:
    source_kind: str
    source: str
    name: str
    description: str = ""
    input_schema: dict | None = None


@dataclass(frozen=True)
class Grant:
    principal: str
    context: bool = False
    read: bool = False
    send: bool = False
    control: bool = False

    def allows(self, operation: str) -> bool:
        return bool(getattr(self, operation)) if operation in OPERATIONS else False


@dataclass(frozen=True)
class InboxEntry:
    message_id: str
    sender_session_id: str
    sender_handle: str
    principal: str
    at: float
    in_reply_to: str | None = None


@dataclass(frozen=True)
class PeerState:
    routes: dict[str, Route] = field(default_factory=dict)
    grants: dict[str, Grant] = field(default_factory=dict)
    inbox: tuple[InboxEntry, ...] = ()

    def __bool__(self) -> bool:
        return bool(self.routes or self.grants or self.inbox)

    def to_obj(self) -> dict:
        return {
            "routes": {k: [r.source_kind, r.source, r.name, r.description, r.input_schema] for k, r in self.routes.items()},
            "grants": {k: [g.principal, g.context, g.read, g.send, g.control] for k, g in self.grants.items()},
            "inbox": [[e.message_id, e.sender_session_id, e.sender_handle, e.principal, e.at, e.in_reply_to]
                      for e in self.inbox],
        }

    @classmethod
    def from_obj(cls, data: dict) -> "PeerState":
        return cls(
            routes={k: Route(*v) for k, v in data.get("routes", {}).items()},
            grants={k: Grant(*v) for k, v in data.get("grants", {}).items()},
            inbox=tuple(InboxEntry(*v) for v in data.get("inbox", ())),
        )


EMPTY = PeerState()
# The event types ``evolve`` reads; the session fold hands it only these.
FOLDED = frozenset({ev.PeerRouteRegistered, ev.PeerRouteRevoked, ev.PeerGrantSet, ev.ProducerMessageAccepted})


def evolve(peers: PeerState, event: ev.Event) -> PeerState:
    """The peer state after one event; the same object when the event does not change it."""
    match event:
        case ev.PeerRouteRegistered():
            route = Route(event.source_kind, event.source, event.name, event.description, event.input_schema)
            key = route_key(event.source_kind, event.source, event.name)
            return replace(peers, routes={**peers.routes, key: route})
        case ev.PeerRouteRevoked():
            key = route_key(event.source_kind, event.source, event.name)
            return replace(peers, routes={k: v for k, v in peers.routes.items() if k != key})
        case ev.PeerGrantSet():
            grant = Grant(event.principal, event.context, event.read, event.send, event.control)
            return replace(peers, grants={**peers.grants, source_key(event.source_kind, event.source): grant})
        case ev.ProducerMessageAccepted(principal=str(principal)) if event.sender_session_id:
            entry = InboxEntry(event.message_id, event.sender_session_id, event.sender_handle or "", principal,
                               event.at, event.in_reply_to)
            return replace(peers, inbox=(*peers.inbox, entry)[-INBOX_LIMIT:])
    return peers


def route_for(peers: PeerState, agent_type: str, session_id: str, name: str) -> Route | None:
    """The route ``name`` from this source to the session holding ``peers``: the session's own, else its type's."""
    return peers.routes.get(route_key("session", session_id, name)) or peers.routes.get(
        route_key("agent_type", agent_type, name)
    )


def inbound(peers: PeerState, message_id: str) -> InboxEntry | None:
    return next((e for e in peers.inbox if e.message_id == message_id), None)


def receives(peers: PeerState) -> bool:
    """Whether the session can hold peer mail: some source may send to it, or some already did."""
    return bool(peers.inbox) or any(g.send for g in peers.grants.values())
