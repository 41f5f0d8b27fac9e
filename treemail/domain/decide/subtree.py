"""Whole subtrees: a broadcast to every descendant, and a cascading stop, bottom-up. Pure.

A broadcast is recorded once on the sender's stream (``SubtreeBroadcastStarted``)
with its recipients fixed at that moment: the descendants the tree index knew
when the broadcast was decided. A session attached later is not one of them,
even when the broadcast is resumed after a crash: a resumed broadcast sends
to exactly the recorded set, so it never sends twice and never widens. Each
copy is then an ordinary send (every guard, every permission) under the
idempotency key ``broadcast:<broadcast_id>:<recipient>``, so a crash in the
middle of the fan-out resumes without a duplicate; what became of each copy
is recorded once at the end (``SubtreeBroadcastDelivered``).

A cascading stop is recorded once on the top's stream (``SubtreeStopStarted``)
with its order: every session after all of its descendants (deepest level
first, the top last), so a child's settlement notice reaches its parent
while the parent is still there to take it, and the notices arrive leaves
first.
"""

from collections.abc import Iterable

from .. import digests
from .. import events as ev
from ..commands import BroadcastToSubtree, InterruptRun, RecordBroadcastDelivery, StopSubtree
from ..errors import Code, LifecycleError, Rejected
from ..records import SessionRecord
from ..results import clip
from .lifecycle import Given, require_registered

STOP_HOWS = ("interrupt", "dispose")


def levels(top: SessionRecord, records: Iterable[SessionRecord]) -> list[list[SessionRecord]]:
    """The subtree under ``top``, level by level (``top`` alone first); each parent's children together,
    by session id (time-ordered to the millisecond: registration order, with no clock read)."""
    children: dict[str | None, list[SessionRecord]] = {}
    for record in records:
        if record.session_id != top.session_id:
            children.setdefault(record.parent_session_id, []).append(record)
    out, level, seen = [], [top], {top.session_id}
    while level:
        out.append(level)
        level = [c for r in level for c in sorted(children.get(r.session_id, []), key=lambda c: c.session_id)
                 if c.session_id not in seen]
        seen.update(c.session_id for c in level)
    return out


def descendants(top: SessionRecord, records: Iterable[SessionRecord]) -> list[SessionRecord]:
    """Every session below ``top``, top-down: the recipients of a broadcast."""
    return [r for level in levels(top, records)[1:] for r in level]


def bottom_up(top: SessionRecord, records: Iterable[SessionRecord]) -> list[SessionRecord]:
    """The subtree, every session after all of its descendants: deepest level first, ``top`` last."""
    return [r for level in reversed(levels(top, records)) for r in level]


def copy_call(broadcast_id: str, recipient: str) -> str:
    """The tool call id a broadcast's copy is sent under: the same on every resumption."""
    return f"broadcast:{broadcast_id}:{recipient}"


def broadcast_digest(session_id: str, run_id: str, call: str) -> str:
    """Where the broadcast is recorded on the sender: one per (sender, run, call), like a tool call."""
    return digests.digest(["message_subtree", session_id, run_id, call])


def broadcast_fingerprint(body: str, mode: str) -> str:
    return digests.digest([body, mode])


def stop_fingerprint(how: str, reason: str | None, closing_text: str | None) -> str:
    """What a stop's idempotency key stands for: a retry under it must ask for the same stop."""
    return digests.digest([how, reason or "", closing_text or ""])


def require_live_broadcaster(given: Given, run_id: str) -> None:
    """Exact live sender, for a broadcast too: only the sender's open run may send one."""
    state = given.state
    if not state.registered:
        raise Rejected(Code.SUBTREE_UNKNOWN_SESSION, "the broadcasting session is not registered with treemail")
    if state.current_run is None or state.current_run != run_id:
        raise Rejected(
            Code.SUBTREE_SENDER_NOT_LIVE,
            f"broadcasting requires the exact live agent: run {clip(run_id, 80)} is not this session's open run; "
            "nothing was sent",
        )


def decide_broadcast(command: BroadcastToSubtree, given: Given) -> list[ev.Event]:
    require_live_broadcaster(given, command.run_id)
    return [ev.SubtreeBroadcastStarted(
        at=given.now, broadcast_id=command.broadcast_id, run_id=command.run_id, body=command.body,
        mode=command.mode, recipients=list(command.recipients), tool_call_id=command.tool_call_id,
    )]


def decide_broadcast_delivery(command: RecordBroadcastDelivery, given: Given) -> list[ev.Event]:
    require_registered(given.state)
    return [ev.SubtreeBroadcastDelivered(at=given.now, broadcast_id=command.broadcast_id,
                                         accepted=dict(command.accepted), refused=dict(command.refused))]


def decide_stop_subtree(command: StopSubtree, given: Given) -> list[ev.Event]:
    require_registered(given.state)
    if command.how not in STOP_HOWS:
        raise LifecycleError("lifecycle:invalid_stop", f"how must be interrupt or dispose, got {clip(command.how, 40)!r}")
    return [ev.SubtreeStopStarted(at=given.now, stop_id=command.stop_id, how=command.how,
                                  order=list(command.order), reason=command.reason)]


def decide_interrupt_run(command: InterruptRun, given: Given) -> list[ev.Event]:
    """The open run, interrupted at its next safe point; nothing for a session with no run open."""
    state = given.state
    require_registered(state)
    if state.current_run is None or state.disposal is not None:
        return []
    return [ev.SessionInterruptRequested(
        at=given.now, interrupt_id=command.interrupt_id, run_id=state.current_run,
        sender_session_id=command.by_session_id, sender_handle=command.by_handle, reason=command.reason,
    )]
