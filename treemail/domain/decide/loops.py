"""The loop guard of a send and the one notice its nearest common ancestor gets. Pure.

The rule itself (fingerprints, streaks) is ``domain/loops.py``. A refused send
is recorded with the recipient's append, against its etag, like the other
refusals decided on the recipient's state. The notice goes to the nearest
common ancestor of the two sessions, in the same atomic step (a tree shares a
partition): on the sender's stream or the recipient's when one of them is the
other's parent, else on the ancestor's, which the worker loads on a second
round (``Refused.ancestor_wanted``). The ancestor's state remembers each
chain it was told of, so a loop refused again and again, by any number of
workers, is noticed once.
"""

from .. import events as ev
from .. import loops, notices
from ..errors import Code, Rejected
from ..records import SessionRecord
from ..state import SessionState
from .guards import Found
from .wake import with_wake

LOOP_PRODUCER = "loop:treemail"


class LoopDetected(Rejected):
    def __init__(self, chain: str, body: str) -> None:
        super().__init__(Code.LOOP_DETECTED, loops.LOOP_MESSAGE)
        self.chain = chain
        self.body = body


def require_no_loop(sender: SessionRecord, sender_state: SessionState, found: Found, run_id: str | None,
                    body: str, cause: tuple[str | None, str | None] | None = None) -> None:
    """``cause``: (caused_by, chain_id) fixed when the message was sent (peer mail at its admission)."""
    _, chain = cause if cause is not None else loops.cause_of(sender_state.run_causes, run_id)
    if chain is None:
        return  # a message that starts a chain answers nothing: it cannot continue a ping-pong
    recipient = found.record.session_id
    if loops.is_loop(found.state.loop_marks.get(sender.session_id), sender_state.loop_marks.get(recipient),
                     chain, body):
        raise LoopDetected(chain, body)


def ancestor_of(sender: SessionRecord, recipient: SessionRecord) -> str | None:
    """The nearest common ancestor when one of the two is the other's parent (the decision has its state);
    None when it is a third session, which the worker looks up and loads."""
    if recipient.parent_session_id == sender.session_id:
        return sender.session_id
    if sender.parent_session_id == recipient.session_id:
        return recipient.session_id
    return None


def notice_events(state: SessionState, chain: str, ancestor: str, sender: SessionRecord,
                  recipient: SessionRecord, body: str, now: float) -> list[ev.Event]:
    """The ancestor's notice, unless it was told of this chain already or cannot take a notice."""
    if chain in state.loop_notices:
        return []
    delivery = notices.notice_delivery(state)
    if delivery == "unavailable":
        return []
    events: list[ev.Event] = []
    if LOOP_PRODUCER not in state.producers:
        events.append(ev.ProducerRegistered(at=now, producer_id=LOOP_PRODUCER, owner="loop"))
    events.append(ev.ProducerMessageAccepted(
        at=now, message_id=loops.notice_id(chain, ancestor), producer_id=LOOP_PRODUCER, owner="loop",
        body=loops.notice_text(loops.session_name(sender.handle, sender.session_id),
                               loops.session_name(recipient.handle, recipient.session_id), chain, body),
        mode="queue" if delivery == "queued" else "steer", chain_id=chain,
    ))
    return with_wake(state, events, now)

