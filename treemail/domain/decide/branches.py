"""Revert and fork: mail follows the session's log. Pure.

An engine reverts a session's history to an earlier position, or forks a new
session from one. Positions are those of the session's treemail stream
(``tm.history.position`` gives the current one; an engine notes it beside the
entries of its own log). Streams stay append-only: a revert is an event,
appended with the events that undo what the session did with its mail on the
reverted branch, so folding the whole stream (a replay) gives exactly what
live processing gave, and every guard, window, hop and wake reads the same
counters either way.

- Revert to P: the claims made after P are released and the consumptions
  after P restored, so that mail is due again; mail accepted after P stays
  pending (a sender was told it was accepted); discards stand (the host
  disposed of that mail on purpose); an open run ends, since the history it
  was building is gone; a session left asleep with mail due is woken.
- Fork at P: a new session of the same tree with the source's origin (agent
  type, rules, parent) and its own id and handle. The source's pending mail
  stays with the source: it is delivered once, where it was sent.
- A position on a reverted branch is refused: nothing can be built on it.
- A session being disposed (or disposed) is not reverted (``lifecycle:closing``).
  Sessions registered while that branch was live ("ghosts") stay registered
  and addressable by their id.
"""

from collections.abc import Mapping, Sequence

from .. import events as ev
from ..commands import ForkSession, RevertSession
from ..errors import LifecycleError
from ..state import MailItem
from .lifecycle import Given, in_order, message_event, decide_register, require_open, require_registered
from .wake import with_wake

INVALID_POSITION = "lifecycle:invalid_position"
History = Sequence[tuple[int, ev.Event]]
# What a revert appends with its SessionReverted: a repeated revert that finds only these since the latest
# revert to its position has nothing left to undo.
_REVERT_PARTS = (
    ev.SessionReverted, ev.ProducerMessageReleased, ev.SessionRunFinished, ev.ProducerMessageRestored,
    ev.SessionWakeRequested,
)


def reverted_at(history: History, position: int) -> int | None:
    """The position of the revert that abandoned ``position``, or None when it is on the live line."""
    for seq, event in history:
        if isinstance(event, ev.SessionReverted) and event.to_position < position <= event.from_position:
            return seq
    return None


def require_position(history: History, position: int) -> None:
    last = history[-1][0] if history else 0
    if not 1 <= position <= last:
        raise LifecycleError(INVALID_POSITION, f"position {position} is not in the session's history (1..{last})")
    abandoned = reverted_at(history, position)
    if abandoned is not None:
        raise LifecycleError(
            INVALID_POSITION, f"position {position} is on a branch the revert at position {abandoned} abandoned"
        )


def _nothing_since(after: list[ev.Event], to_position: int) -> bool:
    """Nothing but a revert to this same position (and what it appended) happened since the cut."""
    if not after:
        return True
    last = max((i for i, e in enumerate(after) if isinstance(e, ev.SessionReverted) and e.to_position == to_position),
               default=None)
    return last is not None and all(isinstance(e, _REVERT_PARTS) for e in after[last:])


def _restored(history: History, after: list[ev.Event], mail: Mapping[str, MailItem], now: float) -> list[ev.Event]:
    """Mail whose latest step after the cut is its consumption: pending again, in acceptance order."""
    latest: dict[str, ev.Event] = {}
    for event in after:
        if isinstance(event, ev.MessageEvent):
            latest[event.message_id] = event
    undone = {m for m, e in latest.items() if isinstance(e, ev.ProducerMessageConsumed) and m not in mail}
    return [
        ev.ProducerMessageRestored(
            at=now, message_id=event.message_id, owner=event.owner, sender_session_id=event.sender_session_id,
            agent_hop=event.agent_hop, run_id=None, mode=event.mode, accepted_seq=seq, expires_at=event.expires_at,
            urgent=event.urgent, peer=event.principal is not None,
        )
        for seq, event in history
        if isinstance(event, ev.ProducerMessageAccepted) and event.message_id in undone
    ]


def restored_senders(command: RevertSession, mail: Mapping[str, MailItem], history: History) -> set[str]:
    """The senders of the agent mail a revert to ``command.to_position`` would restore: each counts it again."""
    after = [event for seq, event in history if seq > command.to_position]
    restored = _restored(history, after, mail, 0.0)
    return {e.sender_session_id for e in restored if e.owner == "agent" and e.sender_session_id}


def decide_revert(command: RevertSession, given: Given) -> list[ev.Event]:
    """Take the session's mail back to ``to_position``; ``given.history`` is the session's whole stream."""
    state, history, to = given.state, given.history, command.to_position
    require_registered(state)
    # Disposal cutoff: past it, mail restored now could never be returned to its senders.
    require_open(state)
    require_position(history, to)
    after = [event for seq, event in history if seq > to]
    if _nothing_since(after, to):
        return []
    events: list[ev.Event] = [ev.SessionReverted(at=given.now, to_position=to, from_position=history[-1][0])]
    run = state.current_run
    if run is not None:
        events += [
            message_event(ev.ProducerMessageReleased, item, run, given.now)
            for item in in_order(given.mail)
            if item.state == "claimed" and item.run_id == run
        ]
        events.append(ev.SessionRunFinished(at=given.now, run_id=run))
    events += _restored(history, after, given.mail, given.now)
    return with_wake(state, events, given.now)


def decide_fork(command: ForkSession, given: Given) -> list[ev.Event]:
    """Register the fork; ``given.state`` is the new session's, ``given.history`` the source's stream."""
    if given.state.registered:
        return []
    history = given.history
    if not history or not isinstance(history[0][1], ev.SessionRegistered):
        raise LifecycleError("lifecycle:unknown_session", f"session {command.source_session_id} is not registered")
    require_position(history, command.at_position)
    return [
        *decide_register(command.registration, given),
        ev.SessionForked(at=given.now, source_session_id=command.source_session_id, at_position=command.at_position),
    ]
