"""Obligations no rule can end any more: reported, never left to wait for ever. Pure.

An accepted message ends consumed, discarded with a reason, or returned to its sender. Each end needs its
recipient to do something: run (a claim, then consumed) or close (the close returns or sets aside all it
holds). A message still pending on a session whose close is done has neither left: a closed session starts
no run and is never woken, and its close, which decided the end of everything else it held, is over. The
current rules never leave one there (the close returns it, or resumes the session for it); an older version,
or a bug, could. The delivery pump's sweep finds it (``may_strand`` over the stored states, then
``unendable`` per message, in ``KeepObligations``) and records it once on the recipient's stream
(``ProducerMessageStranded``), where ``inspect`` shows it, the pump counts it and logs it.

A message that expires is not stranded: its expiry ends it, whatever the session's state.

The same look finds a disposal its host left half done (``disposal_cut_off``): the pump completes it as the host
would have, so what it holds ends by the close's rules.
"""

from .. import events as ev
from ..state import MailItem, SessionState

# A one-shot session, or one a cascading stop sealed: no incarnation will ever run again.
CLOSED_FOR_GOOD = "closed_for_good"
# A resumable session closed with the message pending and not resumed for it: only some unrelated later send
# would start it again.
CLOSED_UNRESUMED = "closed_unresumed"


def may_strand(state: SessionState) -> bool:
    """Whether the session's state alone leaves room for a stranded message: closed, with mail pending."""
    return state.disposal == "closed" and state.pending_all > 0


def needs_a_look(state: SessionState) -> bool:
    """What the pump's look over every session stops at: mail that may be stranded, or a disposal that may have
    been cut off after its cutoff (``disposal_cut_off`` decides, from when it began)."""
    return may_strand(state) or state.disposal == "closing"


def disposal_cut_off(state: SessionState, closing_at: float, now: float, grace_s: float) -> bool:
    """A disposal whose cutoff is ``grace_s`` old and that has not closed: the host that began it died after the
    cutoff (a disposal's own steps take seconds). Its mail waits for a close nobody will make: the mail it cut
    off is never returned, and what was sent for the next incarnation never delivered. The pump completes it."""
    return state.disposal == "closing" and now - closing_at >= grace_s


def unendable(state: SessionState, item: MailItem) -> str | None:
    """Why no rule can end ``item``, pending on a session in ``state``; None while one still can."""
    if state.disposal != "closed" or item.expires_at > 0:
        return None
    return CLOSED_FOR_GOOD if state.sealed or not state.continuable else CLOSED_UNRESUMED


def unreported(state: SessionState, item: MailItem) -> str | None:
    """``unendable``, for a message not reported yet (each is reported once)."""
    return None if item.stranded else unendable(state, item)


def stranded_events(state: SessionState, items: list[MailItem], now: float) -> list[ev.Event]:
    """One report for each message of ``items`` that no rule can end and that was not reported yet."""
    return [
        ev.ProducerMessageStranded(at=now, message_id=item.message_id, owner=item.owner,
                                   sender_session_id=item.sender_session_id, agent_hop=item.agent_hop,
                                   run_id=item.run_id, reason=why)
        for item in items if (why := unreported(state, item)) is not None
    ]
