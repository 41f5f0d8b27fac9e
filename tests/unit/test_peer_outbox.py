"""Peer mail as an outbox, given/when/then on the pure steps: the intent, attempts, backoff, parking, receipt,
refusal, settlement, retry, the shared per-source capacity and the outbox bounds."""

import pytest

from treemail.domain import commitplan, outbound, outbox
from treemail.domain import events as ev
from treemail.domain import state as st
from treemail.domain.commands import (DrivePeerDelivery, PeerSendArguments, RecordPeerAdmission, RetryPeerDelivery,
                                      SendContext, SendToPeer, SettlePeerDelivery)
from treemail.domain.decide.guards import Found
from treemail.domain.decide.lifecycle import Given
from treemail.domain.decide.send import Accepted, Refused, SendGiven
from treemail.domain.errors import Code, LifecycleError
from treemail.domain.handlers import HANDLERS

from .builders import accepted, config, consumed, registered, run_started, session_record

PLANNER = session_record("0190a000-0000-7000-8000-0000000000a1", agent_type="planner", rules=[])
ADVISOR = session_record("0190a000-0000-7000-8000-0000000000b1", agent_type="advisor", rules=[])
ROUTE = ev.PeerRouteRegistered(source_kind="session", source=PLANNER.session_id, name="advisor")
GRANT = ev.PeerGrantSet(source_kind="session", source=PLANNER.session_id, principal="acme", send=True)
T0 = 1000.0


def intent(message_id="m-1", at=T0) -> ev.PeerIntentStored:
    return ev.PeerIntentStored(at=at, message_id=message_id, destination_session_id=ADVISOR.session_id,
                               peer="advisor", principal="acme", body="hi", mode="steer")


def source(*events) -> st.SessionState:
    return st.fold([registered(PLANNER), run_started("run-1"), *events])


def step(state, command, now, **cfg) -> list[ev.Event]:
    return HANDLERS[type(command)].decide(command, Given(state, {}, config(**cfg), now))


def drive(state, now, message_id="m-1", **cfg):
    return step(state, DrivePeerDelivery(PLANNER.session_id, message_id), now, **cfg)


def send(state, tool_call_id="call-1", message_id="m-1", **cfg):
    command = SendToPeer(SendContext(PLANNER.session_id, "run-1", tool_call_id), PeerSendArguments("advisor", "hi"))
    given = SendGiven(sender=PLANNER, sender_state=state, target=Found(ADVISOR, st.fold([registered(ADVISOR), ROUTE,
                                                                                        GRANT])),
                      config=config(**cfg), new_id=message_id, now=T0)
    return HANDLERS[SendToPeer].decide(command, given)


# ---- pending: the intent counts against the source's capacity from the start -------------------------------


def test_a_stored_intent_is_a_pending_row_and_counts_against_the_source_capacity():
    state = source(intent())
    assert state.outstanding == 1
    assert state.outbox["m-1"].status == "pending" and state.outbox["m-1"].since == T0


def test_tree_mail_and_peer_intents_share_one_per_source_capacity():
    tree_receipt = ev.MessageSent(message_id="t-1", recipient_session_id="child", position=3, recipient_state="idle")
    state = source(tree_receipt, intent())
    assert state.outstanding == 2
    assert code_of(send(state, max_outstanding_per_source=2)) is Code.SOURCE_CAPACITY
    assert isinstance(send(state, max_outstanding_per_source=3), Accepted)


def test_the_pending_and_the_retained_rows_are_bounded_each_on_its_own():
    two_pending = source(intent("m-1"), intent("m-2"))
    assert code_of(send(two_pending, max_pending_peer_deliveries=2)) is Code.PEER_OUTBOX_FULL
    receipt = ev.MessageSent(message_id="m-1", recipient_session_id=ADVISOR.session_id, position=4,
                             recipient_state="idle", peer="advisor")
    one_each = source(intent("m-1"), intent("m-2"), receipt)
    assert isinstance(send(one_each, max_pending_peer_deliveries=2, max_retained_peer_deliveries=2), Accepted)
    assert code_of(send(one_each, max_retained_peer_deliveries=1)) is Code.PEER_OUTBOX_FULL


def test_only_the_exact_live_run_may_store_an_intent():
    finished = source(ev.SessionRunFinished(run_id="run-1"))
    assert code_of(send(finished)) is Code.SENDER_NOT_LIVE


# ---- attempts, backoff, timeout, parking ---------------------------------------------------------------------


def test_a_driver_starts_attempt_one_at_once_and_a_second_driver_finds_nothing_to_start():
    state = source(intent())
    [started] = drive(state, T0)
    assert (type(started), started.attempt) == (ev.PeerAttemptStarted, 1)
    assert drive(st.fold([started], state), T0 + 1) == []  # in flight, within its timeout


def test_a_transient_refusal_backs_off_exponentially_and_the_eighth_failure_parks_with_its_reason():
    state, now = source(intent()), T0
    delays = []
    for attempt in range(1, 9):
        [started] = drive(state, now)
        assert started.attempt == attempt
        state = st.fold([started], state)
        answer = step(state, RecordPeerAdmission(PLANNER.session_id, "m-1", attempt, "failed",
                                                 code="send_message:inbox_full"), now)
        state = st.fold(answer, state)
        delays.append(answer[0].retry_at - now)
        now = answer[0].retry_at
        if attempt < 8:
            assert drive(state, now - 0.001) == []  # still backing off
    assert delays == [1, 2, 4, 8, 16, 32, 60, 60]
    row = state.outbox["m-1"]
    assert (row.status, row.reason) == ("parked", "attempts: send_message:inbox_full")
    assert drive(state, now + 10_000) == [] and state.outstanding == 1  # parked keeps its capacity


def test_a_drain_defers_the_attempts_it_refuses_without_spending_the_budget_and_the_deadline_still_holds():
    state, now = source(intent()), T0
    for attempt in range(1, 13):  # past max_attempts (8), all refused by a drain
        [started] = drive(state, now)
        assert (type(started), started.attempt) == (ev.PeerAttemptStarted, attempt)
        state = st.fold([started], state)
        answer = step(state, RecordPeerAdmission(PLANNER.session_id, "m-1", attempt, "failed",
                                                 code="send_message:draining"), now)
        assert [type(e) for e in answer] == [ev.PeerAttemptFailed]  # never parked by the count
        state = st.fold(answer, state)
        now = answer[0].retry_at
    assert state.outbox["m-1"].status == "pending"
    [parked] = drive(state, T0 + 86400)
    assert (type(parked), parked.reason) == (ev.PeerDeliveryParked, "deadline: send_message:draining")


def test_an_attempt_not_answered_within_its_timeout_fails_and_the_next_one_carries_the_same_identity():
    state = source(intent())
    state = st.fold(drive(state, T0), state)
    [failed] = drive(state, T0 + 30)
    assert (type(failed), failed.reason, failed.retry_at) == (ev.PeerAttemptFailed, "attempt_timeout", T0 + 31)
    state = st.fold([failed], state)
    [second] = drive(state, T0 + 31)
    assert second.attempt == 2 and second.message_id == "m-1"


def test_the_deadline_parks_a_delivery_whatever_attempts_are_left():
    state = source(intent())
    [parked] = drive(state, T0 + 86400)
    assert (type(parked), parked.reason) == (ev.PeerDeliveryParked, "deadline")


def test_a_late_answer_to_a_superseded_attempt_changes_nothing_but_a_receipt_always_counts():
    state = source(intent())
    state = st.fold(drive(state, T0), state)
    state = st.fold(drive(state, T0 + 30), state)  # attempt 1 timed out
    state = st.fold(drive(state, T0 + 31), state)  # attempt 2 in flight
    stale = RecordPeerAdmission(PLANNER.session_id, "m-1", 1, "failed", code="send_message:inbox_full")
    assert step(state, stale, T0 + 32) == []
    late_receipt = RecordPeerAdmission(PLANNER.session_id, "m-1", 1, "accepted", position=7, recipient_state="idle")
    [receipt] = step(state, late_receipt, T0 + 32)
    assert (type(receipt), receipt.position, receipt.peer) == (ev.MessageSent, 7, "advisor")


# ---- status back -----------------------------------------------------------------------------------------------


def test_a_receipt_makes_the_row_accepted_without_counting_it_twice_and_its_settlement_releases_it():
    state = source(intent())
    state = st.fold(drive(state, T0), state)
    state = st.fold(step(state, RecordPeerAdmission(PLANNER.session_id, "m-1", 1, "accepted", position=5,
                                                    recipient_state="idle"), T0 + 1), state)
    assert (state.outbox["m-1"].status, state.outstanding) == ("accepted", 1)
    [settled] = step(state, SettlePeerDelivery(PLANNER.session_id, "m-1", "consumed"), T0 + 2)
    state = st.fold([settled], state)
    assert (state.outbox, state.outstanding) == ({}, 0)
    assert step(state, SettlePeerDelivery(PLANNER.session_id, "m-1", "consumed"), T0 + 3) == []  # once


def test_a_definite_refusal_releases_the_capacity_and_cannot_be_retried():
    state = source(intent())
    state = st.fold(drive(state, T0), state)
    [refused] = step(state, RecordPeerAdmission(PLANNER.session_id, "m-1", 1, "refused",
                                                code="peer_message:not_granted"), T0 + 1)
    assert (type(refused), refused.code, refused.peer) == (ev.MessageRefused, "peer_message:not_granted", "advisor")
    state = st.fold([refused], state)
    assert (state.outbox, state.outstanding) == ({}, 0)
    with pytest.raises(LifecycleError) as error:
        step(state, RetryPeerDelivery(PLANNER.session_id, "m-1"), T0 + 2)
    assert error.value.code == "retry_message:settled"


def test_retry_renews_only_a_parked_budget():
    state = source(intent())
    with pytest.raises(LifecycleError) as error:
        step(state, RetryPeerDelivery(PLANNER.session_id, "m-1"), T0)
    assert error.value.code == "retry_message:not_parked"
    parked = st.fold([ev.PeerDeliveryParked(at=T0 + 5, message_id="m-1", reason="deadline")], state)
    [retried] = step(parked, RetryPeerDelivery(PLANNER.session_id, "m-1"), T0 + 100)
    renewed = st.fold([retried], parked).outbox["m-1"]
    assert (renewed.status, renewed.attempts, renewed.since) == ("pending", 0, T0 + 100)
    [started] = drive(st.fold([retried], parked), T0 + 100)
    assert started.attempt == 1


def test_next_check_follows_each_rows_own_clock_and_a_parked_row_needs_none():
    policy = config()
    state = source(intent())
    assert outbox.next_check(state.outbox, policy, T0) == T0
    in_flight = st.fold(drive(state, T0), state)
    assert outbox.next_check(in_flight.outbox, policy, T0) == T0 + 30
    parked = st.fold([ev.PeerDeliveryParked(at=T0, message_id="m-1", reason="x")], state)
    assert outbox.next_check(parked.outbox, policy, T0) is None


# ---- the same-slot bug: consuming peer mail settles nothing on the sender by itself -------------------------------


def test_consuming_peer_mail_writes_no_settlement_on_a_sender_in_the_same_slot():
    peer_message = accepted("m-1", PLANNER).model_copy(update={"principal": "acme", "peer": "advisor"})
    mail = st.evolve_mail({}, peer_message, 3)
    assert mail["m-1"].peer
    assert outbound.mail_senders(None, mail) == set()
    events = [consumed("m-1", PLANNER)]
    assert outbound.sources(ADVISOR.session_id, "running", events, 5, {}, outbound.peer_mail(mail)) == []


def test_consumed_or_discarded_peer_mail_names_its_source_for_its_driver_and_tree_mail_names_none():
    peer_message = accepted("m-1", PLANNER).model_copy(update={"principal": "acme", "peer": "advisor"})
    mail = st.evolve_mail(st.evolve_mail({}, peer_message, 3), accepted("m-2", PLANNER), 4)
    assert outbound.settled_peer_sources(mail, [consumed("m-1", PLANNER)]) == {PLANNER.session_id}
    discarded = ev.ProducerMessageDiscarded(at=1.0, message_id="m-1", owner="agent",
                                            sender_session_id=PLANNER.session_id, reason="expired")
    assert outbound.settled_peer_sources(mail, [discarded]) == {PLANNER.session_id}
    assert outbound.settled_peer_sources(mail, [consumed("m-2", PLANNER)]) == set()  # tree mail: settled in step
    assert outbound.settled_peer_sources(mail, [consumed("m-9", PLANNER)]) == set()  # not read: nothing to say


def test_the_intents_outbound_index_entry_points_at_it_until_its_receipt_replaces_it():
    pairs = outbound.index_entries(PLANNER.session_id, [intent()], 9)
    assert pairs == ["m-1", f"{PLANNER.session_id} 9"]
    plan = commitplan.plan_commit(PLANNER, source(), 2, [intent()])
    assert plan.applied.state.outbox["m-1"].status == "pending"


def code_of(decision) -> Code:
    assert isinstance(decision, Refused), decision
    return decision.code


def test_the_host_discards_only_a_parked_delivery_which_releases_its_capacity():
    from treemail.domain.commands import DiscardPeerDelivery

    state = source(intent())
    with pytest.raises(LifecycleError) as error:
        step(state, DiscardPeerDelivery(PLANNER.session_id, "m-1"), T0)
    assert error.value.code == "retry_message:not_parked"
    parked = st.fold([ev.PeerDeliveryParked(at=T0, message_id="m-1", reason="deadline")], state)
    [settled] = step(parked, DiscardPeerDelivery(PLANNER.session_id, "m-1", "gave up"), T0 + 1)
    assert (type(settled), settled.outcome, settled.reason) == (ev.MessageSettled, "discarded", "gave up")
    after = st.fold([settled], parked)
    assert (after.outbox, after.outstanding) == ({}, 0)


def test_an_accepted_row_is_asked_about_its_settlement_ever_less_often_never_now_and_at_most_every_minute():
    policy = config()
    row = outbox.Row("m-1", ADVISOR.session_id, "advisor", status="accepted", accepted_at=T0)
    checks, now = [], T0
    for _ in range(9):
        now = outbox.settlement_check_at(row, policy, now)
        checks.append(now - T0)
    assert checks == [1, 2, 4, 8, 16, 32, 60, 120, 180]
