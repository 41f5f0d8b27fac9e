"""The session lifecycle in decide_send: the exact live sender, draining, the disposal cutoff, parents,
resumability. Pure.

Given the sender's and recipient's histories, when the send is decided, then
it is accepted or refused with its own stable code, in a fixed order.
"""

import pytest

from treemail.domain import events as ev
from treemail.domain.decide import idempotency
from treemail.domain.decide.guards import NoSuchSession
from treemail.domain.commands import SendArguments
from treemail.domain.decide.send import Accepted, Replayed
from treemail.domain.errors import Code

from .builders import (
    closed,
    closing,
    config,
    drain_started,
    found,
    registered,
    registered_as,
    run_finished,
    run_started,
    send,
    status_changed,
    tree,
)
from .test_decide_send import refused_code

T = tree()


def live(record, run_id="run-1", *more):
    return (registered(record), run_started(run_id), *more)


# ---- exact live sender -----------------------------------------------------------------------------


def test_an_invented_run_id_is_not_the_live_sender():
    decision = send(T.root, found(T.child), sender_events=live(T.root, "run-1"), run_id="run-invented")
    assert refused_code(decision) is Code.SENDER_NOT_LIVE


def test_a_session_with_no_open_run_cannot_send():
    decision = send(T.root, found(T.child), sender_events=(registered(T.root, status="running"),))
    assert refused_code(decision) is Code.SENDER_NOT_LIVE


def test_a_tool_call_still_in_flight_from_an_ended_run_is_refused():
    decision = send(T.root, found(T.child), sender_events=live(T.root, "run-1", run_finished("run-1")))
    assert refused_code(decision) is Code.SENDER_NOT_LIVE


def test_a_resumed_session_is_a_new_incarnation_only_its_new_run_may_send():
    history = live(T.root, "run-1", run_finished("run-1"), run_started("run-2"))
    assert refused_code(send(T.root, found(T.child), sender_events=history, run_id="run-1")) is Code.SENDER_NOT_LIVE
    assert isinstance(send(T.root, found(T.child), sender_events=history, run_id="run-2"), Accepted)


def test_the_live_sender_is_checked_before_anything_else():
    """Disabled messaging, an over-long body, an unknown recipient and a drain: the stale run is still what is said."""
    decision = send(
        T.root, NoSuchSession("0190a000-0000-7000-8000-00000000beef"), body="too long",
        cfg=config(enabled=False, max_body_bytes=1),
        sender_events=live(T.root, "run-1", drain_started(T.root.session_id)), run_id="run-0",
        service_draining=True,
    )
    assert refused_code(decision) is Code.SENDER_NOT_LIVE
    # Only a blank body comes first: it is refused while the arguments are parsed, before any context.
    assert refused_code(send(T.root, found(T.child), body=" ", run_id="run-0")) is Code.INVALID_BODY


@pytest.mark.parametrize("now", [
    {"sender_events": live(T.root, "run-1", run_finished("run-1"))},
    {"sender_events": live(T.root, "run-1", drain_started(T.root.session_id))},
    {"service_draining": True},
    {"sender_events": live(T.root, "run-1", closing())},
    {"target": found(T.child, registered(T.child), closing())},
    {"target": found(T.child, registered_as(T.child, continuable=False), status_changed("finished"))},
], ids=["run ended", "subtree draining", "service draining", "sender closing", "recipient closing",
        "not resumable"])
def test_a_retried_tool_call_whose_first_decision_accepted_it_gets_that_outcome_not_todays_refusal(now):
    first = send(T.root, found(T.child))
    assert isinstance(first, Accepted)
    recorded = idempotency.record(SendArguments(to="explore_00000002", body="hello"), {"ok": first.result})
    retried = send(T.root, now.get("target", found(T.child)), recorded=recorded,
                   **{k: v for k, v in now.items() if k != "target"})
    assert isinstance(retried, Replayed) and retried.outcome == {"ok": first.result}


def test_a_stale_run_is_never_recorded_the_other_lifecycle_refusals_are():
    """sender_not_live says nothing about the call (a record would refuse a run not yet opened for good);
    the refusals on drains, disposal, parents and resumability are kept like any other a worker decides."""
    assert not idempotency.is_recorded(Code.SENDER_NOT_LIVE) and not idempotency.is_recorded_alone(Code.SENDER_NOT_LIVE)
    for code in (Code.DRAINING, Code.RECIPIENT_CLOSING, Code.SENDER_CLOSING, Code.PARENT_UNAVAILABLE,
                 Code.NOT_RESUMABLE):
        assert idempotency.is_recorded_alone(code)


# ---- draining ----------------------------------------------------------------------------------------


def test_a_draining_service_refuses_every_new_send():
    assert refused_code(send(T.root, found(T.child), service_draining=True)) is Code.DRAINING


def test_a_sender_in_a_draining_subtree_is_refused():
    decision = send(T.child, found(T.root), sender_events=live(T.child, "run-1", drain_started(T.root.session_id)))
    assert refused_code(decision) is Code.DRAINING


def test_a_recipient_in_a_draining_subtree_is_refused():
    recipient = found(T.child, registered(T.child), drain_started(T.child.session_id))
    assert refused_code(send(T.root, recipient)) is Code.DRAINING


def test_a_lifted_drain_admits_again():
    recipient = found(T.child, registered(T.child), drain_started("x"), ev.SessionDrainLifted(by="x"))
    assert isinstance(send(T.root, recipient), Accepted)


# ---- the disposal cutoff -------------------------------------------------------------------------------


@pytest.mark.parametrize("after", [(closing(),), (closing(), closed())], ids=["closing", "closed"])
def test_a_send_after_a_one_shot_recipients_cutoff_is_refused(after):
    recipient = found(T.child, registered_as(T.child, continuable=False), *after)
    assert refused_code(send(T.root, recipient)) is Code.RECIPIENT_CLOSING


def test_a_send_to_a_continuable_recipient_being_disposed_waits_for_its_next_incarnation():
    decision = send(T.root, found(T.child, registered(T.child), closing()))
    [message] = [e for e in decision.events if isinstance(e, ev.ProducerMessageAccepted)]
    assert message.next_incarnation and not any(isinstance(e, ev.SessionWakeRequested) for e in decision.events)


def test_a_send_to_a_disposed_continuable_recipient_resumes_it_cold():
    decision = send(T.root, found(T.child, registered(T.child, status="idle"), closing(), closed()))
    kinds = [type(e) for e in decision.events]
    assert kinds[0] is ev.SessionResumed and kinds[-1] is ev.SessionWakeRequested
    assert not [e for e in decision.events if isinstance(e, ev.ProducerMessageAccepted)][0].next_incarnation


def test_a_sender_being_disposed_is_refused_while_its_run_is_still_open():
    decision = send(T.child, found(T.sibling), sender_events=live(T.child, "run-1", closing()))
    assert refused_code(decision) is Code.SENDER_CLOSING


def test_a_send_before_the_cutoff_is_accepted():
    assert isinstance(send(T.root, found(T.child, registered(T.child))), Accepted)


# ---- parent unavailable ---------------------------------------------------------------------------------


@pytest.mark.parametrize("after", [(closing(),), (closing(), closed())], ids=["closing", "closed"])
def test_a_child_writing_to_a_disposed_parent_gets_parent_unavailable(after):
    parent = found(T.root, registered(T.root), *after)
    assert refused_code(send(T.child, parent)) is Code.PARENT_UNAVAILABLE


def test_a_parent_whose_records_are_gone_is_unavailable_not_unknown():
    decision = send(T.child, NoSuchSession(T.root.session_id), to=T.root.session_id)
    assert refused_code(decision) is Code.PARENT_UNAVAILABLE


def test_another_unknown_session_stays_unknown():
    decision = send(T.child, NoSuchSession("0190a000-0000-7000-8000-00000000beef"))
    assert refused_code(decision) is Code.UNKNOWN_SESSION


# ---- not resumable ---------------------------------------------------------------------------------------


def test_mail_to_a_finished_session_that_cannot_be_resumed_is_refused():
    recipient = found(T.child, registered_as(T.child, continuable=False), status_changed("finished"))
    assert refused_code(send(T.root, recipient)) is Code.NOT_RESUMABLE


def test_mail_to_an_idle_session_that_cannot_be_resumed_waits_for_its_host_and_never_wakes_it():
    recipient = found(T.child, registered_as(T.child, status="idle", continuable=False))
    decision = send(T.root, recipient)
    assert isinstance(decision, Accepted)
    assert not any(isinstance(e, ev.SessionWakeRequested) for e in decision.events)


def test_mail_to_a_finished_continuable_session_wakes_it():
    decision = send(T.root, found(T.child, registered(T.child), status_changed("finished")))
    assert isinstance(decision, Accepted)
    assert isinstance(decision.events[-1], ev.SessionWakeRequested)
