"""The peer side of a session: the routes and grants that lead to it, and its peer inbox. Pure.

Routes and grants are stored on the *target's* stream and folded into its
state. A send over a route is committed on that same stream with its etag,
so the route and the grant a send was decided on are exactly those in force
when it was appended: a revocation in between makes the commit conflict and
the send is decided again (and refused).

The inbox is the session's own record of peer mail it received (sender,
principal, reference, time), newest last and bounded: a reply may name only
one of these references. An entry stays until its message was read (consumed
or discarded); only read entries make room for new ones, and while the bound
is all unread mail the destination refuses more (``peer_message:inbox_full``,
retried by the source's driver), so a reader paging through it misses nothing.
Each entry carries its arrival number: a page's cursor is a number, which new
arrivals and evictions never move.
"""

import re
from dataclasses import dataclass, field

from . import events as ev
from .frozen import replace

SOURCE_KINDS = ("session", "agent_type")
OPERATIONS = ("context", "read", "send", "control")
# Enough references for a model to answer the conversations it is in; the
# inbox rides in the state snapshot rewritten by every append, so it stays small.
# It bounds both the entries kept and the unread ones a destination admits.
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
    number: int = 0  # the arrival number: 1 for the session's first peer message, never reused
    read: bool = False  # consumed or discarded: the entry may make room for a newer one


@dataclass(frozen=True)
class PeerState:
    routes: dict[str, Route] = field(default_factory=dict)
    grants: dict[str, Grant] = field(default_factory=dict)
    inbox: tuple[InboxEntry, ...] = ()
    arrivals: int = 0  # peer messages ever received: the next entry's number less one

    def __bool__(self) -> bool:
        return bool(self.routes or self.grants or self.inbox)

    def to_obj(self) -> dict:
        return {
            "routes": {k: [r.source_kind, r.source, r.name, r.description, r.input_schema] for k, r in self.routes.items()},
            "grants": {k: [g.principal, g.context, g.read, g.send, g.control] for k, g in self.grants.items()},
            "inbox": [[e.message_id, e.sender_session_id, e.sender_handle, e.principal, e.at, e.in_reply_to,
                       e.number, e.read] for e in self.inbox],
            "arrivals": self.arrivals,
        }

    @classmethod
    def from_obj(cls, data: dict) -> "PeerState":
        inbox = tuple(InboxEntry(*v) for v in data.get("inbox", ()))
        if "arrivals" not in data:
            # A snapshot older than arrival numbers: its entries are numbered in their order.
            inbox = tuple(replace(e, number=i + 1) for i, e in enumerate(inbox))
        return cls(
            routes={k: Route(*v) for k, v in data.get("routes", {}).items()},
            grants={k: Grant(*v) for k, v in data.get("grants", {}).items()},
            inbox=inbox,
            arrivals=data.get("arrivals", len(inbox)),
        )


EMPTY = PeerState()
# The event types ``evolve`` reads; the session fold hands it only these.
FOLDED = frozenset({ev.PeerRouteRegistered, ev.PeerRouteRevoked, ev.PeerGrantSet, ev.ProducerMessageAccepted,
                    ev.ProducerMessageConsumed, ev.ProducerMessageDiscarded})


def evolve(peers: PeerState, event: ev.Event) -> PeerState:
    """The peer state after one event; the same object when the event does not change it."""
    if type(event) is ev.ProducerMessageAccepted and event.principal is None:
        # Tree mail, the event every send folds: it never reaches the peer inbox. Said before the cases, which
        # it would pass one type check through the models' metaclass at a time (``events.other_types``).
        return peers
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
            number = peers.arrivals + 1
            entry = InboxEntry(event.message_id, event.sender_session_id, event.sender_handle or "", principal,
                               event.at, event.in_reply_to, number)
            return replace(peers, inbox=_room_made((*peers.inbox, entry)), arrivals=number)
        case ev.ProducerMessageConsumed() | ev.ProducerMessageDiscarded() if peers.inbox:
            inbox = tuple(replace(e, read=True) if e.message_id == event.message_id and not e.read else e
                          for e in peers.inbox)
            if any(a is not b for a, b in zip(inbox, peers.inbox)):
                return replace(peers, inbox=inbox)
    return peers


def _room_made(inbox: tuple[InboxEntry, ...]) -> tuple[InboxEntry, ...]:
    """Over the bound, the oldest read entries go; an unread one never does (a stream from before the
    admission refused a full inbox may hold more unread ones than the bound: they are all kept)."""
    excess = len(inbox) - INBOX_LIMIT
    if excess <= 0:
        return inbox
    kept = []
    for entry in inbox:
        if excess > 0 and entry.read:
            excess -= 1
            continue
        kept.append(entry)
    return tuple(kept)


def unread(peers: PeerState) -> int:
    return sum(1 for e in peers.inbox if not e.read)


def page(entries: list[InboxEntry], limit: int, before: int | None) -> tuple[list[InboxEntry], int | None]:
    """One page of ``entries`` (newest first) older than arrival ``before`` (None: from the newest), and the
    cursor of the next page (None: nothing older remains). New arrivals are newer than every cursor handed
    out, so following the cursors reaches every entry that was there when the first page was read."""
    older = [e for e in entries if before is None or e.number < before]
    shown = older[:limit]
    return shown, (shown[-1].number if len(older) > limit else None)


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
