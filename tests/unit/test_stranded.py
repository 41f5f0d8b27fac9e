"""Mail no rule can end any more: which it is, the pump's one report of it, and what inspect shows. Pure,
given/when/then on states folded from events (the way an older version or a bug could have left a stream)."""

import pytest

from treemail.adapters.compact import decode_item, encode_item
from treemail.domain import events as ev
from treemail.domain.commands import KeepObligations
from treemail.domain.decide.delivery import next_check
from treemail.domain.decide.lifecycle import Given
from treemail.domain.decide.obligations import decide_keep
from treemail.domain.decide.stranded import CLOSED_FOR_GOOD, CLOSED_UNRESUMED, may_strand, unendable
from treemail.domain.outbound import status_of
from treemail.producers.tools.message import render

from .builders import History, accepted, closed, closing, config, registered_as, tree

T = tree()
CFG = config()
NOW = 1000.0


def child(*events, continuable: bool = True) -> History:
    return History(registered_as(T.child, "idle", continuable), *events)


def item_of(h: History):
    return h.mail["m-1"]


# A message left pending by a close that neither returned it nor resumed the session for it: what the current
# close never does, and a stream an older version (or a bug) wrote can hold.
LEFT_BY_A_CLOSE = (closing(), closed(), accepted("m-1", T.root))


@pytest.mark.parametrize("events, continuable, why", [
    ((*LEFT_BY_A_CLOSE,), False, CLOSED_FOR_GOOD),
    ((*LEFT_BY_A_CLOSE, ev.SessionSealed(stop_id="st-1")), True, CLOSED_FOR_GOOD),
    ((*LEFT_BY_A_CLOSE,), True, CLOSED_UNRESUMED),
], ids=["one-shot", "sealed", "resumable"])
def test_mail_pending_on_a_closed_session_is_unendable(events, continuable, why):
    h = child(*events, continuable=continuable)
    assert may_strand(h.state) and unendable(h.state, item_of(h)) == why


@pytest.mark.parametrize("events, continuable", [
    ((accepted("m-1", T.root),), True),  # open and idle: a wake delivers it
    ((accepted("m-1", T.root), closing()), False),  # closing: its close returns it
    ((closing(), accepted("m-1", T.root).model_copy(update={"next_incarnation": True})), True),  # held: resumes it
    ((accepted("m-1", T.root), ev.SessionStatusChanged(status="finished")), False),  # one-shot finished: a dispose
    # its expiry ends it
    ((closing(), closed(), accepted("m-1", T.root).model_copy(update={"expires_at": NOW + 60})), False),
], ids=["idle", "closing", "held-while-closing", "one-shot-finished", "expires"])
def test_mail_some_rule_can_still_end_is_not(events, continuable):
    h = child(*events, continuable=continuable)
    assert unendable(h.state, item_of(h)) is None


def test_a_closed_session_with_nothing_pending_cannot_strand_anything():
    assert not may_strand(child(closing(), closed(), continuable=False).state)
    assert not may_strand(child(accepted("m-1", T.root), closing()).state)


def test_the_pump_reports_a_stranded_message_once_and_the_due_index_asks_for_that_once():
    h = child(*LEFT_BY_A_CLOSE, continuable=False)
    assert next_check(h.state, h.mail.values(), CFG, NOW) == NOW  # due at once: the next pass reports it
    [report] = h.then(decide_keep(KeepObligations("c"), Given(h.state, h.mail, CFG, NOW)))
    assert isinstance(report, ev.ProducerMessageStranded)
    assert (report.message_id, report.reason, report.sender_session_id) == ("m-1", CLOSED_FOR_GOOD,
                                                                         T.root.session_id)
    # Reported, still pending (a report is not an end), and never reported again.
    assert item_of(h).stranded == CLOSED_FOR_GOOD and h.state.pending_agent == 1
    assert decide_keep(KeepObligations("c"), Given(h.state, h.mail, CFG, NOW + 3600)) == []
    assert next_check(h.state, h.mail.values(), CFG, NOW) != NOW


def test_a_healthy_session_gets_no_report():
    h = child(accepted("m-1", T.root))
    assert not [e for e in decide_keep(KeepObligations("c"), Given(h.state, h.mail, CFG, NOW))
                if isinstance(e, ev.ProducerMessageStranded)]


def test_inspect_says_a_message_is_stranded_and_why():
    h = child(*LEFT_BY_A_CLOSE, continuable=False)
    sent = ev.MessageSent(message_id="m-1", recipient_session_id=T.child.session_id, position=3,
                          recipient_state="queued")
    assert "stranded" not in status_of("m-1", T.root.session_id, sent, None, item_of(h), CFG, NOW)
    h.then(decide_keep(KeepObligations("c"), Given(h.state, h.mail, CFG, NOW)))
    status = status_of("m-1", T.root.session_id, sent, None, item_of(h), CFG, NOW)
    assert (status["status"], status["stranded"]) == ("accepted", CLOSED_FOR_GOOD)
    assert "  stranded: closed_for_good" in render(status).splitlines()  # `treemail inspect` prints it
    # Kept in the item the commit writes, and read back the same.
    stored = item_of(h)
    assert decode_item("m-1", encode_item(stored)) == stored
