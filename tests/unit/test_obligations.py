"""Delivery as an obligation: attempts, backoff, deadlines, parking, the pump's decision, retry,
per-source capacity, the sender's record and inspect. Given/when/then on pure functions, an injected clock."""


import pytest

from treemail.domain import events as ev
from treemail.domain.commands import ClaimMail, FinishRun, KeepObligations, ReleaseMail, RetryMail, StartRun
from treemail.domain.decide.delivery import backoff_delay, next_check
from treemail.domain.decide.lifecycle import Given, decide_claim, decide_finish_run, decide_release, decide_start_run
from treemail.domain.decide.obligations import decide_keep, decide_retry
from treemail.domain.decide.send import Accepted, Refused
from treemail.domain.errors import Code, LifecycleError
from treemail.domain.outbound import index_entries, index_reference, may_inspect, source_events, status_of

from .builders import History, accepted, config, found, registered, run_started, send, tree

T = tree()
CFG = config()  # 30 s attempts, backoff 1..60 s, 8 attempts, 24 h deadline


def running(*events) -> History:
    return History(registered(T.child, status="running"), run_started("run-1"), *events)


def at(h: History, now: float, cfg=CFG) -> Given:
    return Given(h.state, h.mail, cfg, now)


def kinds(events) -> list[str]:
    return [type(e).__name__ for e in events]


def claim_and_release(h: History, now: float) -> list[ev.Event]:
    h.then(decide_claim(ClaimMail("s", "run-1"), at(h, now)))
    return h.then(decide_release(ReleaseMail("s", "m-1"), at(h, now)))


def claim_and_fail(h: History, now: float) -> list[ev.Event]:
    """The open run claims the message and ends without acknowledging it; the next run starts at once."""
    run = h.state.current_run
    h.then(decide_claim(ClaimMail("s", run), at(h, now)))
    failed = [e for e in h.then(decide_finish_run(FinishRun("s", run), at(h, now)))
              if isinstance(e, ev.MessageEvent)]
    h.then(decide_start_run(StartRun("s", f"{run}+"), at(h, now)))
    return failed


def sent_at(t: float, message_id: str = "m-1", **kw) -> ev.ProducerMessageAccepted:
    return accepted(message_id, T.root, **kw).model_copy(update={"at": t})


# ---- attempts and backoff ---------------------------------------------------------------------


def test_backoff_doubles_from_one_second_and_stops_at_sixty():
    assert [backoff_delay(CFG, n) for n in range(1, 10)] == [1, 2, 4, 8, 16, 32, 60, 60, 60]
    assert backoff_delay(config(backoff_initial_s=0.1, backoff_max_s=0.3), 3) == 0.3


def test_each_failed_attempt_waits_its_backoff():
    h = running(sent_at(100.0))
    [released] = claim_and_fail(h, now=100.0)
    assert (released.reason, released.retry_at) == ("run_finished", 101.0)
    assert h.mail["m-1"].attempts == 1
    assert decide_claim(ClaimMail("s", "run-1+"), at(h, 100.9)) == []
    [second] = claim_and_fail(h, now=101.0)
    assert (second.retry_at, h.mail["m-1"].attempts) == (103.0, 2)


def test_a_release_at_a_step_boundary_is_not_a_failure_due_at_the_next_boundary_and_never_parks():
    h = running(sent_at(0.0))
    for _ in range(20):
        [released] = claim_and_release(h, now=5.0)
        assert (type(released), released.reason, released.retry_at) == (ev.ProducerMessageReleased, "released", 0.0)
    # Each claim counted an attempt and each release gave it back.
    assert h.mail["m-1"].attempts == 0 and h.mail["m-1"].state == "released"


def test_the_eighth_failed_attempt_parks_the_message_with_its_reason():
    h = running(sent_at(0.0))
    now = 0.0
    for attempt in range(1, 8):
        [event] = claim_and_fail(h, now)
        assert isinstance(event, ev.ProducerMessageReleased), attempt
        now = event.retry_at
    [parked] = claim_and_fail(h, now)
    assert isinstance(parked, ev.ProducerMessageParked) and parked.reason == "max_attempts"
    assert h.mail["m-1"].state == "parked" and h.mail["m-1"].attempts == 8
    # Parked mail is still pending (it holds its inbox slot) but is never claimed or admitted again.
    assert h.state.pending_agent == 1
    assert decide_claim(ClaimMail("s", h.state.current_run), at(h, now + 1000)) == []


def test_max_attempts_is_configuration():
    h = running(sent_at(0.0))
    cfg = config(max_attempts=1)
    h.then(decide_claim(ClaimMail("s", "run-1"), at(h, 0.0, cfg)))
    [parked] = [e for e in decide_finish_run(FinishRun("s", "run-1"), at(h, 0.0, cfg))
                if isinstance(e, ev.MessageEvent)]
    assert parked.reason == "max_attempts"


def test_a_run_ending_with_an_open_claim_is_a_failed_attempt_and_backs_off():
    h = running(sent_at(0.0))
    h.then(decide_claim(ClaimMail("s", "run-1"), at(h, 5.0)))
    events = h.then(decide_finish_run(FinishRun("s", "run-1"), at(h, 6.0)))
    [released] = [e for e in events if isinstance(e, ev.ProducerMessageReleased)]
    assert (released.reason, released.retry_at) == ("run_finished", 7.0)
    assert h.mail["m-1"].attempts == 1
    # Not woken at once: the pump wakes it when the backoff ends (a run that claims once is not woken 8 times in 10 s).
    assert not any(isinstance(e, ev.SessionWakeRequested) for e in events)


def test_a_woken_run_that_ends_without_claiming_is_a_failed_attempt_counted_backed_off_then_parked():
    h = asleep_with_mail()
    now, retry_ats = 0.0, []
    for attempt in range(1, 9):
        h.then(decide_start_run(StartRun("s", f"run-{attempt}"), at(h, now)))  # the provider fails: no claim
        events = h.then(decide_finish_run(FinishRun("s", f"run-{attempt}", "error"), at(h, now)))
        assert not any(isinstance(e, ev.SessionWakeRequested) for e in events), attempt
        [failed] = [e for e in events if isinstance(e, ev.MessageEvent)]
        if attempt < 8:
            assert (type(failed), failed.reason) == (ev.ProducerMessageReleased, "wake_unclaimed")
            assert h.mail["m-1"].attempts == attempt
            retry_ats.append(failed.retry_at - now)
            assert decide_keep(KeepObligations("s"), at(h, failed.retry_at - 0.01)) == []
            now = failed.retry_at
            assert kinds(h.then(decide_keep(KeepObligations("s"), at(h, now)))) == ["SessionWakeRequested"]
    assert retry_ats == [1, 2, 4, 8, 16, 32, 60]
    assert (type(failed), failed.reason, h.mail["m-1"].state) == (ev.ProducerMessageParked, "max_attempts", "parked")
    assert decide_keep(KeepObligations("s"), at(h, now + 1e6)) == []


def test_new_mail_wakes_a_session_whose_other_mail_is_backing_off():
    h = asleep_with_mail()
    h.then(decide_start_run(StartRun("s", "run-1"), at(h, 0.0)))
    h.then(decide_finish_run(FinishRun("s", "run-1"), at(h, 0.0)))  # backing off until 1.0
    from treemail.domain.decide.wake import with_wake
    events = with_wake(h.state, [sent_at(0.5, "m-2")], 0.5, h.mail)
    assert kinds(events) == ["ProducerMessageAccepted", "SessionWakeRequested"]


# ---- the attempt timeout (the pump's decision) --------------------------------------------------


def test_a_claim_neither_consumed_nor_released_within_the_timeout_is_released_by_treemail():
    h = running(sent_at(0.0))
    h.then(decide_claim(ClaimMail("s", "run-1"), at(h, 10.0)))
    assert decide_keep(KeepObligations("s"), at(h, 39.9)) == []
    [released] = h.then(decide_keep(KeepObligations("s"), at(h, 40.0)))
    assert (type(released), released.reason, released.retry_at) == (ev.ProducerMessageReleased, "attempt_timeout", 41.0)
    # Deciding again on the state it left does nothing: two pumps never release twice.
    assert decide_keep(KeepObligations("s"), at(h, 40.0)) == []


def test_the_timeout_is_configuration():
    h = running(sent_at(0.0))
    h.then(decide_claim(ClaimMail("s", "run-1"), at(h, 0.0)))
    assert kinds(decide_keep(KeepObligations("s"), at(h, 0.25, config(attempt_timeout_s=0.25)))) == [
        "ProducerMessageReleased"]


def test_a_claim_of_an_agent_served_over_http_is_a_lease_that_the_pump_ends_as_a_failed_attempt():
    h = History(registered(T.child, status="running"), run_started("mcp-http:r"), sent_at(0.0))
    h.then(decide_claim(ClaimMail("s", "mcp-http:r"), at(h, 10.0)))
    # No connection confirms it while the model thinks: it lasts the lease (60 s), not the 30 s attempt timeout.
    assert decide_keep(KeepObligations("s"), at(h, 69.9)) == []
    assert next_check(h.state, h.mail.values(), CFG, 10.0) == 70.0
    [released] = h.then(decide_keep(KeepObligations("s"), at(h, 70.0)))
    assert (type(released), released.reason, released.retry_at) == (ev.ProducerMessageReleased, "attempt_timeout", 71.0)
    assert h.mail["m-1"].attempts == 1 and h.mail["m-1"].shown == 1  # counted, and shown again marked
    assert decide_keep(KeepObligations("s"), at(h, 70.0)) == []


def test_the_lease_is_configuration():
    h = History(registered(T.child, status="running"), run_started("mcp-http:r"), sent_at(0.0))
    h.then(decide_claim(ClaimMail("s", "mcp-http:r"), at(h, 0.0)))
    assert kinds(decide_keep(KeepObligations("s"), at(h, 5.0, config(mcp_lease_s=5.0)))) == ["ProducerMessageReleased"]


# ---- deadlines ------------------------------------------------------------------------------------


def test_mail_unprocessed_a_day_after_acceptance_is_parked_by_the_pump():
    h = History(registered(T.child, status="queued"), sent_at(1000.0))
    assert decide_keep(KeepObligations("s"), at(h, 1000.0 + 86399)) == []
    [parked] = h.then(decide_keep(KeepObligations("s"), at(h, 1000.0 + 86400)))
    assert isinstance(parked, ev.ProducerMessageParked) and parked.reason == "deadline"
    assert decide_keep(KeepObligations("s"), at(h, 1000.0 + 90000)) == []


def test_a_claimed_message_past_its_deadline_is_left_to_its_attempt_and_parked_when_that_fails():
    h = running(sent_at(1.0))
    h.then(decide_claim(ClaimMail("s", "run-1"), at(h, 86390.0)))
    assert decide_keep(KeepObligations("s"), at(h, 86410.0)) == []
    [parked] = [e for e in decide_finish_run(FinishRun("s", "run-1"), at(h, 86410.0)) if isinstance(e, ev.MessageEvent)]
    assert isinstance(parked, ev.ProducerMessageParked) and parked.reason == "deadline"


# ---- wakes ----------------------------------------------------------------------------------------


def asleep_with_mail(*extra) -> History:
    return History(registered(T.child, status="idle"), sent_at(0.0), *extra)


def test_a_run_that_ends_with_only_backing_off_mail_is_not_woken_until_the_backoff_ends():
    h = running(sent_at(0.0))
    claim_and_release(h, now=10.0)  # due at the next boundary; the run ends before it takes it again
    events = h.then(decide_finish_run(FinishRun("s", "run-1"), at(h, 10.5)))  # a failed attempt: due at 11.5
    assert not any(isinstance(e, ev.SessionWakeRequested) for e in events)
    assert decide_keep(KeepObligations("s"), at(h, 11.4)) == []
    assert kinds(decide_keep(KeepObligations("s"), at(h, 11.5))) == ["SessionWakeRequested"]


def test_a_wake_nobody_answered_within_an_attempt_timeout_is_requested_again_once():
    h = asleep_with_mail(ev.SessionWakeRequested(at=5.0, message_id="m-1"))
    assert decide_keep(KeepObligations("s"), at(h, 34.9)) == []
    h.then(decide_keep(KeepObligations("s"), at(h, 35.0)))
    assert h.state.wake_requested_at == 35.0
    assert decide_keep(KeepObligations("s"), at(h, 35.0)) == []


def test_reconcile_treats_every_wake_requested_before_it_as_possibly_lost():
    h = asleep_with_mail(ev.SessionWakeRequested(at=5.0, message_id="m-1"))
    assert kinds(decide_keep(KeepObligations("s", stale_before=6.0), at(h, 6.0))) == ["SessionWakeRequested"]


def test_parked_mail_alone_never_wakes_a_session_and_is_not_admitted():
    h = asleep_with_mail(ev.ProducerMessageParked(message_id="m-1", owner="agent",
                                                  sender_session_id=T.root.session_id, reason="deadline"))
    assert decide_keep(KeepObligations("s"), at(h, 1e9)) == []
    assert kinds(decide_start_run(StartRun("s", "run-2"), at(h, 1.0))) == ["SessionRunStarted"]


# ---- explicit retry -------------------------------------------------------------------------------


def parked_history() -> History:
    return asleep_with_mail(ev.ProducerMessageParked(message_id="m-1", owner="agent",
                                                     sender_session_id=T.root.session_id, reason="max_attempts"))


def test_retry_renews_a_parked_message_budget_and_wakes_its_sleeping_recipient():
    h = parked_history()
    events = h.then(decide_retry(RetryMail("s", "m-1"), at(h, 500.0)))
    assert kinds(events) == ["ProducerMessageRetried", "SessionWakeRequested"]
    item = h.mail["m-1"]
    # Every attempt ahead of it again, and the deadline counted from the retry.
    assert (item.state, item.attempts, item.since, item.retry_at) == ("released", 0, 500.0, 0.0)


@pytest.mark.parametrize("history", [lambda: asleep_with_mail(), lambda: History(registered(T.child))])
def test_only_a_parked_message_can_be_retried(history):
    h = history()
    with pytest.raises(LifecycleError) as caught:
        decide_retry(RetryMail("s", "m-1"), at(h, 1.0))
    assert caught.value.code in ("retry_message:not_parked", "lifecycle:unknown_message")


# ---- when the pump must look ------------------------------------------------------------------------


def test_next_check_is_the_claim_expiry_the_deadline_or_the_end_of_a_sleeping_session_backoff():
    h = running(sent_at(100.0))
    assert next_check(h.state, h.mail.values(), CFG, 100.0) == 100.0 + 86400
    h.then(decide_claim(ClaimMail("s", "run-1"), at(h, 200.0)))
    assert next_check(h.state, h.mail.values(), CFG, 200.0) == 230.0
    h.then(decide_release(ReleaseMail("s", "m-1"), at(h, 200.0)))  # running: its next claim takes it
    assert next_check(h.state, h.mail.values(), CFG, 200.0) == 100.0 + 86400
    h.then(decide_finish_run(FinishRun("s", "run-1"), at(h, 200.5)))  # asleep: the pump wakes it at 201.5
    assert next_check(h.state, h.mail.values(), CFG, 200.5) == 201.5
    assert next_check(History(registered(T.child)).state, [], CFG, 0.0) is None


# ---- per-source capacity ------------------------------------------------------------------------------


def sender_with(outstanding: int) -> list[ev.Event]:
    # Sending from its open run (only the exact live sender may send).
    return [registered(T.root), run_started("run-1")] + [
        ev.MessageSent(message_id=f"m-{i}", recipient_session_id=T.child.session_id, position=i,
                       recipient_state="running") for i in range(outstanding)]


def test_a_source_at_its_capacity_is_refused_and_the_refusal_is_recorded():
    cfg = config(max_outstanding_per_source=3, max_inflight_per_pair=0)
    refused = send(T.root, found(T.child), sender_events=tuple(sender_with(3)), cfg=cfg)
    assert isinstance(refused, Refused) and refused.code is Code.SOURCE_CAPACITY and refused.recorded
    assert isinstance(send(T.root, found(T.child), sender_events=tuple(sender_with(2)), cfg=cfg), Accepted)


def test_settled_intents_free_the_source_capacity():
    events = sender_with(3) + [ev.MessageSettled(message_id="m-0", recipient_session_id=T.child.session_id,
                                                 outcome="consumed")]
    assert History(*events).state.outstanding == 2
    cfg = config(max_outstanding_per_source=3, max_inflight_per_pair=0)
    assert isinstance(send(T.root, found(T.child), sender_events=tuple(events), cfg=cfg), Accepted)


def test_the_capacity_is_at_most_a_thousand():
    with pytest.raises(ValueError):
        config(max_outstanding_per_source=1001)
    assert config().max_outstanding_per_source == 256


# ---- the sender's record, and what inspect shows ----------------------------------------------------


def test_accepting_and_settling_agent_mail_imply_records_on_the_sender_stream():
    recipient = [registered(T.child), sent_at(1.0, "m-1"), accepted("p-1", owner="plugin")]
    implied = source_events(T.child.session_id, "running", recipient[1:], version=1)
    [sent] = implied[T.root.session_id]
    assert (sent.message_id, sent.position, sent.recipient_state) == ("m-1", 2, "running")
    done = ev.ProducerMessageDiscarded(message_id="m-1", owner="agent", sender_session_id=T.root.session_id,
                                       reason="stale\x00" + "x" * 500)
    [settled] = source_events(T.child.session_id, "running", [done], version=5)[T.root.session_id]
    assert settled.outcome == "discarded" and len(settled.reason) <= 120 and "\x00" not in settled.reason


def status(sent_events, item=None, now=0.0) -> dict:
    """What inspect shows, reading the records where the index entries the events wrote point."""
    index = dict(zip(*[iter(index_entries(T.root.session_id, sent_events, first_position=10))] * 2))
    stream = dict(enumerate(sent_events, start=10))
    sender, position = index_reference(index["m-1"])
    assert sender == T.root.session_id
    settled = stream[index_reference(index["m-1:settled"])[1]] if "m-1:settled" in index else None
    return status_of("m-1", sender, stream[position], settled, item, CFG, now)


def test_inspect_shows_the_receipt_attempts_parking_settlement_and_refusal():
    sent = ev.MessageSent(at=1.0, message_id="m-1", recipient_session_id="r", position=7, recipient_state="queued")
    h = running(sent_at(1.0))
    claim_and_fail(h, now=2.0)
    accepted_status = status([sent], h.mail["m-1"], now=2.5)
    assert accepted_status["status"] == "accepted" and accepted_status["receipt"]["position"] == 7
    assert (accepted_status["attempts"], accepted_status["reason"], accepted_status["next_attempt_at"]) == (
        1, "run_finished", 3.0)
    parked = parked_history().mail["m-1"]
    assert (status([sent], parked)["status"], status([sent], parked)["reason"]) == ("parked", "max_attempts")
    settled = ev.MessageSettled(message_id="m-1", recipient_session_id="r", outcome="discarded", reason="stale")
    processed = status([sent, settled])
    assert processed["status"] == "processed" and processed["settlement"]["outcome"] == "discarded"
    refused = status([ev.MessageRefused(message_id="m-1", recipient_session_id="r", code="send_message:inbox_full")])
    assert (refused["status"], refused["reason"]) == ("refused", "send_message:inbox_full")


def test_only_the_sender_its_ancestors_and_the_host_may_inspect():
    assert may_inspect(None, "s", ["p", "root"])
    assert may_inspect("s", "s", ["p", "root"])
    assert may_inspect("root", "s", ["p", "root"])
    assert not may_inspect("sibling", "s", ["p", "root"])
