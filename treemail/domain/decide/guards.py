"""The send guards: one ``require_*`` per stable error code, each raising ``Rejected``."""

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from .. import effective
from .. import peers as peer_state
from ..errors import Code, Rejected
from ..messaging import MessagingConfig
from ..records import Peer, SessionRecord
from ..results import clip
from ..state import SessionState


# What the loader found for the model's `to`.
@dataclass(frozen=True)
class Found:
    record: SessionRecord
    state: SessionState


@dataclass(frozen=True)
class NoSuchSession:
    session_id: str


@dataclass(frozen=True)
class NoSuchHandle:
    reference: str
    peers: list[Peer] = field(default_factory=list)


Target = Found | NoSuchSession | NoSuchHandle

# The self-repairing candidate list is bounded (bounded result truncation):
# at most this many rows, then a line saying how many were left out. 40 rows of at most ~180
# characters keep the whole list, its last line included, inside the 8 KiB any error text is cut to.
CANDIDATE_LIMIT = 40
# How much of the model's own `to` an error echoes, and of a peer's description a row shows.
REFERENCE_SHOWN = 80
DESCRIPTION_SHOWN = 100


def require_sender(sender: SessionRecord | None, state: SessionState) -> SessionRecord:
    if sender is None or not state.registered:
        raise Rejected(Code.UNKNOWN_SESSION, "the sending session is not registered with treemail")
    return sender


def require_enabled(config: MessagingConfig) -> None:
    if not config.enabled:
        raise Rejected(Code.DISABLED, "agent messaging is disabled in this engine ([messaging] enabled = false)")


def require_tool(sender: SessionRecord, overlay: Iterable[tuple[str, str]] = ()) -> None:
    if not effective.tool_visible(sender, overlay):
        raise Rejected(Code.PERMISSION_DENIED, "permission denied: this agent has no send_message tool")


def require_not_blank(body: str) -> None:
    """Blank is empty: checked while the arguments are parsed, before resolution and the master switch."""
    if not body.strip():
        raise Rejected(Code.INVALID_BODY, "body is empty or only whitespace; write the message in `body`")


def require_body(body: str, limit: int) -> None:
    size = len(body.encode("utf-8"))
    if size == 0:
        raise Rejected(Code.INVALID_BODY, "body is empty; write the message in `body`")
    if size > limit:
        raise Rejected(
            Code.INVALID_BODY,
            f"body is {size} bytes (UTF-8); the limit is {limit} bytes: shorten the message",
        )



def render_peer(peer: Peer) -> str:
    """``handle — description — status (session_id <uuid>)``; the agent type stands in for an empty
    description, and a peer without a handle prints its UUID once."""
    record = peer.record
    about = clip(" ".join(record.description.split()) or record.agent_type, DESCRIPTION_SHOWN)
    if not record.handle:
        return f"{record.session_id} — {about} — {peer.status}"
    return f"{record.handle} — {about} — {peer.status} (session_id {record.session_id})"


def candidate_list(peers: list[Peer], addressable: Callable[[Peer], bool] = lambda peer: True) -> str:
    """The peers the sender may address, sorted by handle, bounded; ``(none)`` when nobody."""
    rows = sorted((p for p in peers if addressable(p)), key=lambda p: (p.record.handle or p.record.session_id))
    lines = [f"- {render_peer(p)}" for p in rows[:CANDIDATE_LIMIT]] or ["- (none)"]
    if len(rows) > CANDIDATE_LIMIT:
        lines.append(f"- … and {len(rows) - CANDIDATE_LIMIT} more not listed")
    return "\n".join(lines)


def require_known(target: Target, code: Code, unknown_handle: Callable[[NoSuchHandle], str]) -> Found:
    """The target the model named, found and registered; otherwise ``code``, and for a handle nobody holds
    the self-repairing message ``unknown_handle`` writes (it lists whom the caller can address)."""
    match target:
        case NoSuchSession(session_id=session_id):
            raise Rejected(code, f"no session has id {session_id}")
        case NoSuchHandle():
            raise Rejected(code, unknown_handle(target))
        case Found(record=record, state=state) if not state.registered:
            raise Rejected(code, f"no session has id {record.session_id}")
        case Found():
            return target
    raise AssertionError(target)


def require_recipient(
    sender: SessionRecord, target: Target, addressable: Callable[[Peer], bool] = lambda peer: True
) -> Found:
    found = require_known(target, Code.UNKNOWN_SESSION, lambda unknown: (
        f"unknown subagent reference `{clip(unknown.reference, REFERENCE_SHOWN)}`: use a handle or session_id "
        f"from this list of agents in your tree:\n{candidate_list(unknown.peers, addressable)}"
    ))
    if found.record.root_session_id != sender.root_session_id:
        raise Rejected(Code.NOT_TREE_PEER, f"session {found.record.session_id} is not in your delegation tree")
    if found.record.session_id == sender.session_id:
        raise Rejected(Code.SELF_SEND, "you cannot send a message to yourself")
    return found


def label_text(label: str) -> str:
    return {"*": "tree peer"}.get(label, label)


def permission_denied(label: str) -> Rejected:
    return Rejected(Code.PERMISSION_DENIED, f"permission denied: message to your {label_text(label)}")


def sending_hop(sender_state: SessionState, run_id: str) -> int:
    observed = sender_state.run_hops.get(run_id)
    return 0 if observed is None else observed + 1


def require_hops(hop: int, config: MessagingConfig) -> None:
    if config.max_hops > 0 and hop > config.max_hops:
        raise Rejected(
            Code.MAX_HOPS_EXCEEDED,
            f"this message would be hop {hop} of a chain limited to {config.max_hops} hops; "
            "stop relaying and report to your parent instead",
        )


def require_inbox_room(state: SessionState, config: MessagingConfig) -> None:
    if state.pending_agent >= config.max_pending_per_session:
        raise Rejected(
            Code.INBOX_FULL,
            f"the recipient already has {state.pending_agent} unread agent messages "
            f"(limit {config.max_pending_per_session}); try again later",
        )


def require_peer_inbox_room(state: SessionState) -> None:
    """The peer inbox keeps every unread entry: a destination whose bound is all unread mail admits no more
    (transient: the source's driver tries again once some of it was read) rather than drop one unseen."""
    unread = peer_state.unread(state.peers)
    if unread >= peer_state.INBOX_LIMIT:
        raise Rejected(
            Code.PEER_INBOX_FULL,
            f"the recipient's peer inbox already holds {unread} unread messages (limit {peer_state.INBOX_LIMIT}); "
            "the delivery is tried again later",
        )


def require_window_room(state: SessionState, sender_id: str, config: MessagingConfig) -> None:
    window = config.max_inflight_per_pair
    if window > 0 and state.pair_inflight.get(sender_id, 0) >= window:
        raise Rejected(
            Code.INFLIGHT_FULL,
            f"you already have {window} messages to this recipient that it has not processed; "
            "wait for it to read them before sending more",
        )


# Mail as an obligation: a source's unsettled intents are bounded.
def require_source_capacity(sender_state: SessionState, config: MessagingConfig) -> None:
    if sender_state.outstanding >= config.max_outstanding_per_source:
        raise Rejected(
            Code.SOURCE_CAPACITY,
            f"you already have {sender_state.outstanding} sent messages that their recipients have not "
            f"processed (limit {config.max_outstanding_per_source}); wait for them before sending more",
        )
