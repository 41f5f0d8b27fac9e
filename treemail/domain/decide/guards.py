"""The send guards: one ``require_*`` per stable error code, each raising ``Rejected``."""

from dataclasses import dataclass, field

from .. import permissions
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


def require_sender(sender: SessionRecord | None, state: SessionState) -> SessionRecord:
    if sender is None or not state.registered:
        raise Rejected(Code.UNKNOWN_SESSION, "the sending session is not registered with treemail")
    return sender


def require_enabled(config: MessagingConfig) -> None:
    if not config.enabled:
        raise Rejected(Code.DISABLED, "agent messaging is disabled in this engine ([messaging] enabled = false)")


def require_tool(sender: SessionRecord) -> None:
    if not (sender.send_message_tool and permissions.tool_visible(sender.rules)):
        raise Rejected(Code.PERMISSION_DENIED, "permission denied: this agent has no send_message tool")


def require_body(body: str, limit: int) -> None:
    size = len(body.encode("utf-8"))
    if size == 0:
        raise Rejected(Code.INVALID_BODY, "body is empty; write the message in `body`")
    if size > limit:
        raise Rejected(
            Code.INVALID_BODY,
            f"body is {size} bytes (UTF-8); the limit is {limit} bytes: shorten the message",
        )


# The self-repairing error lists at most this many peers, each description cut to a line:
# a tree of thousands must not answer one typo with a megabyte.
LISTED_PEERS = 40
DESCRIPTION_CHARS = 80
ECHOED_REFERENCE_CHARS = 80


def render_peer(peer: Peer) -> str:
    record = peer.record
    description = clip(record.description, DESCRIPTION_CHARS)
    return f"{record.handle} — {description} — {peer.status} (session_id {record.session_id})"


def require_recipient(sender: SessionRecord, target: Target) -> Found:
    match target:
        case NoSuchSession(session_id=session_id):
            raise Rejected(Code.UNKNOWN_SESSION, f"no session has id {session_id}")
        case NoSuchHandle(reference=reference, peers=peers):
            lines = [f"- {render_peer(p)}" for p in peers[:LISTED_PEERS]]
            if len(peers) > LISTED_PEERS:
                lines.append(f"- … and {len(peers) - LISTED_PEERS} more (ask your parent for the one you need)")
            listing = "\n".join(lines) or "- (no addressable peers)"
            raise Rejected(
                Code.UNKNOWN_SESSION,
                f"unknown subagent reference `{clip(reference, ECHOED_REFERENCE_CHARS)}`: use a handle or "
                f"session_id from this list of agents in your tree:\n{listing}",
            )
        case Found(record=record, state=state) if not state.registered:
            raise Rejected(Code.UNKNOWN_SESSION, f"no session has id {record.session_id}")
        case Found(record=record) if record.root_session_id != sender.root_session_id:
            raise Rejected(Code.NOT_TREE_PEER, f"session {record.session_id} is not in your delegation tree")
        case Found(record=record) if record.session_id == sender.session_id:
            raise Rejected(Code.SELF_SEND, "you cannot send a message to yourself")
        case Found():
            return target
    raise AssertionError(target)


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


def require_window_room(state: SessionState, sender_id: str, config: MessagingConfig) -> None:
    window = config.max_inflight_per_pair
    if window > 0 and state.pair_inflight.get(sender_id, 0) >= window:
        raise Rejected(
            Code.INFLIGHT_FULL,
            f"you already have {window} messages to this recipient that it has not processed; "
            "wait for it to read them before sending more",
        )
