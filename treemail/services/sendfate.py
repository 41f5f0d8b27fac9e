"""What becomes of one command of a send round, from its decision alone. Pure.

A round sorts each decided command into one fate before anything is written (``sends``): the commit then
writes the appends and records the round collected, and answers the rest.
"""

from enum import Enum

from ..domain.decide.guards import NoSuchHandle, NoSuchSession
from ..domain.decide.send import Accepted, AwaitsApproval, Refused, Replayed, SendDecision
from ..domain.records import SessionRecord


class Fate(Enum):
    # Its nearest common ancestor must be loaded first (loop detection): decided again in the next round.
    AGAIN = "again"
    # Decided on held states that its own append would not check (``heldreads``): the whole round is decided
    # again on a fresh read.
    DISCARD = "discard"
    # A refusal that touches no session: only its idempotency record is kept.
    RECORDED_ALONE = "recorded alone"
    # Nothing to write: answered as decided (a replayed call, a refusal not recorded, a pending approval).
    ANSWERED = "answered"
    # Its append carries the decision (and, where it may, the answer).
    APPENDED = "appended"


def appends(decision: SendDecision) -> bool:
    """Whether the decision is written by an append of its own."""
    match decision:
        case AwaitsApproval(events=[]) | Refused(recorded=False) | Replayed():
            return False
    return True


def checked_by_its_append(decision: SendDecision, sender: SessionRecord | None,
                          target: SessionRecord | NoSuchSession | NoSuchHandle | None) -> bool:
    """Whether the append checks every state the decision read (``heldreads``): it is on the recipient's
    stream, and the sender's record rides along as a source (or the sender is the recipient)."""
    if sender is None or not isinstance(decision, (Accepted, Refused)) or not appends(decision):
        return False
    if isinstance(decision, Refused) and decision.recorded_alone:
        return False
    return (any(source.record.session_id == sender.session_id for source in decision.sources)
            or sender.session_id == target.session_id)


def fate_of(decision: SendDecision, sender: SessionRecord | None,
            target: SessionRecord | NoSuchSession | NoSuchHandle | None, on_held: bool) -> Fate:
    """The fate of a command decided as ``decision``; ``on_held``: decided on the states the worker holds."""
    if isinstance(decision, Refused) and decision.ancestor_wanted:
        return Fate.AGAIN
    if on_held and not checked_by_its_append(decision, sender, target):
        return Fate.DISCARD
    if isinstance(decision, Refused) and decision.recorded_alone and sender is not None:
        return Fate.RECORDED_ALONE
    return Fate.APPENDED if appends(decision) else Fate.ANSWERED

