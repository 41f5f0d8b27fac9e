"""Disposal and draining: the cutoff, mail that never disappears, drains over a subtree.

A disposal is three steps, each repeatable: ``DisposeSession`` opens the
cutoff (closing) and puts back what the open run claimed, so nothing can be
delivered or acknowledged after it; ``ReturnMail`` on each sender's stream
hands back every pending agent message as a notice; ``CloseSession`` sets
every pending message aside with what became of it, and closes. It refuses
while an agent message has not been returned, so none is ever dropped.

A continuable session's disposal is not its end: mail sent while it closes
waits for its next incarnation and resumes it once it closed. A session a
cascading stop sealed (``SealSession``) closes for good: the mail held for a
next incarnation is returned like any other, and nothing resumes it.
"""

from .. import events as ev
from .. import notices
from ..commands import CloseSession, DisposeSession, DrainSession, LiftDrain, ReturnMail, SealSession
from ..errors import LifecycleError
from ..state import NEXT_INCARNATION
from .lifecycle import Given, in_order, message_event, require_registered
from .settlement import owed, settle_with
from .wake import with_wake

RETURNED_PRODUCER = "returned:treemail"
# The bounded reason (never raw text) of a claim the disposal cutoff put back.
CLOSING = "closing"
NOT_AGENT_MAIL = "recipient disposed before processing it; not agent mail, so there was no sender to return it to"
# Why a parked peer delivery of a disposed sender is given up.
SENDER_DISPOSED = "its sender was disposed before it was delivered"


def returned_reason(notice_id: str | None) -> str:
    """The discard reason of an agent message its recipient never processed: where it went."""
    if notice_id is None:
        return "recipient disposed before processing it; its sender is gone, so it could not be returned"
    return f"recipient disposed before processing it; returned to its sender as notice {notice_id}"


def decide_dispose(command: DisposeSession, given: Given) -> list[ev.Event]:
    state = given.state
    require_registered(state)
    if state.disposal is not None:
        return []  # already past the cutoff: a repeated dispose resumes the later steps
    # Released with no backoff and no attempt failed: the message is returned, never claimed again.
    released = [
        message_event(ev.ProducerMessageReleased, item, item.run_id, given.now, reason=CLOSING)
        for item in in_order(given.mail)
        if item.state == "claimed"
    ]
    return [
        ev.SessionClosing(at=given.now, stop_reason=command.stop_reason, closing_text=command.closing_text),
        *released,
    ]


def decide_return_mail(command: ReturnMail, given: Given) -> list[ev.Event]:
    """On the sender's stream; nothing when the sender is gone (its recipient records that instead)."""
    return returned_notice(given, command.notice_id,
                           notices.returned_text(command.recipient_handle, command.body, command.stop_reason))


def returned_notice(given: Given, notice_id: str, text: str) -> list[ev.Event]:
    """A ``message_returned`` notice on the sender's stream (given), saying ``text`` of a message of its that
    will never be delivered; nothing when the sender can take no notice any more."""
    state = given.state
    delivery = notices.notice_delivery(state)
    if delivery == "unavailable":
        return []
    events: list[ev.Event] = []
    if RETURNED_PRODUCER not in state.producers:
        events.append(ev.ProducerRegistered(at=given.now, producer_id=RETURNED_PRODUCER, owner="returned"))
    events.append(
        ev.ProducerMessageAccepted(
            at=given.now, message_id=notice_id, producer_id=RETURNED_PRODUCER, owner="returned", body=text,
            mode="steer" if delivery in ("steered", "injected") else "queue",
        )
    )
    return with_wake(state, events, given.now)


def decide_close(command: CloseSession, given: Given) -> list[ev.Event]:
    state = given.state
    require_registered(state)
    if state.disposal == "closed":
        return []
    if state.disposal is None:
        raise LifecycleError("lifecycle:not_closing", "dispose the session before closing it")
    returned = dict(command.returned)
    # Mail sent while it closed waits for the next incarnation: never returned, never set aside; unless the
    # session closes for good, when it is returned like the rest.
    waiting = [m for m in in_order(given.mail) if m.reason == NEXT_INCARNATION and not state.sealed]
    pending = [m for m in in_order(given.mail) if m.reason != NEXT_INCARNATION or state.sealed]
    unreturned = [m.message_id for m in pending if m.owner == "agent" and m.message_id not in returned]
    if unreturned:
        raise LifecycleError(
            "lifecycle:unreturned_mail", f"pending agent mail not yet returned to its senders: {unreturned}"
        )
    events: list[ev.Event] = []
    if state.current_run is not None:
        # The disposal cut the open run short.
        events.append(ev.SessionRunFinished(at=given.now, run_id=state.current_run, reason="aborted"))
    events += [
        message_event(
            ev.ProducerMessageDiscarded, item, item.run_id, given.now,
            reason=returned.get(item.message_id, NOT_AGENT_MAIL),
        )
        for item in pending
    ]
    # Peer mail it stored that waits parked for a retry: nobody will make one for a disposed sender, so it is
    # given up with the disposal. (One still pending is refused at its next attempt, past this cutoff.)
    events += [ev.MessageSettled(at=given.now, message_id=row.message_id, recipient_session_id=row.destination,
                                 outcome="discarded", reason=SENDER_DISPOSED)
               for row in state.outbox.values() if row.status == "parked"]
    events.append(ev.SessionClosed(at=given.now))
    if command.settle is not None and owed(state, None, True):
        settled, _ = settle_with(command.settle, given.session_id, state, given.senders, None, True, given.now)
        events.append(settled)
    if waiting:
        # The disposal has settled: the mail that waited for it starts the next incarnation (cold resume).
        events.append(ev.SessionResumed(at=given.now))
        return with_wake(state, events, given.now, given.mail)
    return events


def decide_seal(command: SealSession, given: Given) -> list[ev.Event]:
    """Once per session, whichever stop reached it first; a session already closed is sealed all the same, so
    a send that would resume it is refused."""
    require_registered(given.state)
    if given.state.sealed:
        return []
    return [ev.SessionSealed(at=given.now, stop_id=command.stop_id)]


def decide_drain(command: DrainSession, given: Given) -> list[ev.Event]:
    require_registered(given.state)
    if command.by in given.state.drained_by:
        return []
    return [ev.SessionDrainStarted(at=given.now, by=command.by)]


def decide_lift_drain(command: LiftDrain, given: Given) -> list[ev.Event]:
    require_registered(given.state)
    if command.by not in given.state.drained_by:
        return []
    return [ev.SessionDrainLifted(at=given.now, by=command.by)]
