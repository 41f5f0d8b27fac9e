"""Who may send, and to whom, as sessions end: one ``require_*`` per stable code.

Checked by ``decide_send`` in a fixed order: the exact live sender before
anything else, then draining, then the sender's own disposal; after the
recipient is resolved, the parent's availability, draining, the disposal
cutoff and resumability.
"""

from ..errors import Code, Rejected
from ..results import clip
from ..records import SessionRecord
from ..state import SessionState
from .guards import Found, NoSuchSession, Target

NOT_DELIVERED = "the message was not delivered"


def require_live_sender(state: SessionState, run_id: str) -> None:
    """The run in the host's context must be the session's open run: each run is its own incarnation."""
    if state.current_run is None:
        raise Rejected(
            Code.SENDER_NOT_LIVE,
            f"message delivery requires the exact live sender agent: this session has no open run; {NOT_DELIVERED}",
        )
    if state.current_run != run_id:
        raise Rejected(
            Code.SENDER_NOT_LIVE,
            f"message delivery requires the exact live sender agent: run {clip(run_id, 80)} is not this "
            f"session's open run; {NOT_DELIVERED}",
        )


def require_admitting(service_draining: bool, state: SessionState) -> None:
    if service_draining:
        raise Rejected(Code.DRAINING, f"the message service is draining and accepts no new messages; {NOT_DELIVERED}")
    if state.drained_by:
        raise Rejected(
            Code.DRAINING, f"your part of the agent tree is draining and sends no new messages; {NOT_DELIVERED}"
        )


def require_sender_open(state: SessionState) -> None:
    if state.disposal is not None:
        raise Rejected(Code.SENDER_CLOSING, f"this agent is being disposed; {NOT_DELIVERED}")


def require_sender_admitted(state: SessionState, run_id: str, service_draining: bool) -> None:
    """Everything about the sender alone, in that order: exact live sender, draining, the sender's disposal."""
    require_live_sender(state, run_id)
    require_admitting(service_draining, state)
    require_sender_open(state)


def require_parent_available(sender: SessionRecord, target: Target) -> None:
    """A child writing to a parent that is disposed or gone; the parent's id outlives every record of it."""
    parent = sender.parent_session_id
    if parent is None:
        return
    match target:
        case NoSuchSession(session_id=session_id) if session_id.lower() == parent:
            gone = True
        case Found(record=record, state=state) if record.session_id == parent:
            gone = not state.registered or state.disposal is not None
        case _:
            gone = False
    if gone:
        raise Rejected(Code.PARENT_UNAVAILABLE, f"your direct parent is not live; {NOT_DELIVERED}")


def require_recipient_admitting(found: Found, next_incarnation: bool = False) -> None:
    """``next_incarnation``: a tree send, which a continuable recipient being (or done being) disposed takes
    into its next incarnation; mail over a peer route is refused past the cutoff all the same."""
    state, handle = found.state, found.record.address
    if state.drained_by:
        raise Rejected(Code.DRAINING, f"{handle}'s part of the agent tree is draining; {NOT_DELIVERED}")
    if state.disposal is not None and not (next_incarnation and state.continuable and not state.sealed):
        # Only a send that no next incarnation can take is refused: a continuable recipient's mail waits for the
        # disposal to settle (``next_incarnation``) or resumes it (cold resume). A cascading stop closes a session
        # for good: it has no next incarnation.
        ended = "was stopped for good" if state.sealed else "is being disposed"
        raise Rejected(Code.RECIPIENT_CLOSING, f"{handle} {ended} and takes no new messages; {NOT_DELIVERED}")
    if state.status == "finished" and not state.continuable:
        raise Rejected(
            Code.NOT_RESUMABLE, f"{handle} has finished and cannot be resumed by a message; {NOT_DELIVERED}"
        )
