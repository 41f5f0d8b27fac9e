"""The steer deadline: steer mail a running recipient does not take in time falls back to queue, on the record,
and reaches the next run start like queued mail. Given/when/then on pure functions, an injected clock."""

from treemail.domain import events as ev
from treemail.domain.commands import ClaimMail, ClaimTurn, FinishRun, KeepObligations, ReleaseMail, StartRun
from treemail.domain.decide.delivery import next_check
from treemail.domain.decide.lifecycle import (
    Given, claimable, decide_claim, decide_claim_turn, decide_finish_run, decide_release, decide_start_run,
)
from treemail.domain.decide.obligations import decide_keep
from treemail.domain.outbound import status_of

from .builders import History, accepted, config, registered, run_started, tree

T = tree()
STEER = config(steer_deadline_s=20.0, steer_max_boundaries=2)


def running(*events) -> History:
    return History(registered(T.child, status="running"), run_started("run-1"), *events)


def sent_at(t: float, message_id: str = "m-1", mode: str = "steer") -> ev.ProducerMessageAccepted:
    return accepted(message_id, T.root, mode=mode).model_copy(update={"at": t})


def at(h: History, now: float, cfg=STEER) -> Given:
    return Given(h.state, h.mail, cfg, now)


def fallbacks(events) -> list[tuple[str, str]]:
    return [(e.message_id, e.reason) for e in events if isinstance(e, ev.ProducerMessageSteerFellBack)]


def test_the_pump_looks_at_a_waiting_steer_message_at_its_deadline_and_only_then():
    h = running(sent_at(100.0), sent_at(100.0, "q-1", mode="queue"))
    assert next_check(h.state, h.mail.values(), STEER, 100.0) == 120.0
    assert next_check(h.state, h.mail.values(), config(), 100.0) == 100.0 + 86400  # off: the delivery deadline
    idle = History(registered(T.child, status="idle"), sent_at(100.0))
    assert next_check(idle.state, idle.mail.values(), STEER, 100.0) != 120.0  # no run to wait on: no steer deadline


def test_a_run_that_never_reaches_a_boundary_queues_its_steer_mail_at_the_deadline():
    h = running(sent_at(100.0), sent_at(110.0, "m-2"))
    assert decide_keep(KeepObligations("s"), at(h, 119.9)) == []
    fell = h.then(decide_keep(KeepObligations("s"), at(h, 120.0)))
    assert fallbacks(fell) == [("m-1", "deadline")]
    assert fell[0].run_id == "run-1" and fell[0].waited_s == 20.0
    item = h.mail["m-1"]
    assert (item.state, item.mode, item.reason, claimable(item)) == ("accepted", "queue", "steer_deadline", False)
    assert decide_keep(KeepObligations("s"), at(h, 120.0)) == []  # decided once: a second pump finds nothing
    # The run's next boundary does not take it (it waits for a new turn); the other steer message it takes.
    claimed = decide_claim(ClaimMail("s", "run-1"), at(h, 125.0))
    assert [e.message_id for e in claimed] == ["m-2"]
    # A new turn of a lasting run, or the next run start, takes it as queued mail.
    assert [e.message_id for e in decide_claim_turn(ClaimTurn("s", "run-1"), at(h, 125.0))] == ["m-1", "m-2"]


def test_a_run_that_ends_with_steer_mail_unclaimed_queues_it_on_the_record_for_the_next_run():
    h = running(sent_at(100.0), sent_at(101.0, "q-1", mode="queue"))
    finished = h.then(decide_finish_run(FinishRun("s", "run-1"), at(h, 105.0, config())))
    assert fallbacks(finished) == [("m-1", "run_finished")]  # whatever the deadline settings: the queue one is not
    assert isinstance(finished[-1], ev.SessionWakeRequested)  # asleep with mail due: woken, as for queued mail
    assert not any(isinstance(e, ev.ProducerMessageReleased) for e in finished)  # not a failed attempt
    assert h.mail["m-1"].attempts == 0
    started = decide_start_run(StartRun("s", "run-2"), at(h, 106.0))
    assert {e.message_id for e in started if isinstance(e, ev.ProducerMessageAdmitted)} == {"m-1", "q-1"}


def test_steer_mail_handed_back_at_the_configured_number_of_boundaries_falls_back():
    h = running(sent_at(100.0))
    for boundary, now in enumerate((101.0, 102.0), start=1):
        h.then(decide_claim(ClaimMail("s", "run-1", step=boundary), at(h, now)))
        released = h.then(decide_release(ReleaseMail("s", "m-1"), at(h, now)))
    assert fallbacks(released) == [("m-1", "boundaries")] and released[-1].boundaries == 2
    assert h.mail["m-1"].mode == "queue"
    assert [type(e).__name__ for e in decide_claim(ClaimMail("s", "run-1", step=3), at(h, 103.0))] == [
        "RunStepReported"]  # the step took nothing: only the step is recorded
    # Under the limit, a release is just a release.
    h = running(sent_at(100.0))
    h.then(decide_claim(ClaimMail("s", "run-1"), at(h, 101.0)))
    assert fallbacks(decide_release(ReleaseMail("s", "m-1"), at(h, 101.0))) == []


def test_steer_mail_admitted_at_a_run_start_or_claimed_in_time_is_not_touched():
    h = History(registered(T.child, status="idle"), sent_at(100.0))
    h.then(decide_start_run(StartRun("s", "run-1"), at(h, 101.0)))  # the run's input: admitted, not waiting
    assert decide_keep(KeepObligations("s"), at(h, 500.0)) == []
    h = running(sent_at(100.0))
    h.then(decide_claim(ClaimMail("s", "run-1"), at(h, 110.0)))
    assert fallbacks(decide_keep(KeepObligations("s"), at(h, 125.0))) == []


def test_inspect_shows_the_fallback_as_the_reason():
    h = running(sent_at(100.0))
    h.then(decide_keep(KeepObligations("s"), at(h, 130.0)))
    sent = ev.MessageSent(at=100.0, message_id="m-1", recipient_session_id="r", position=3, recipient_state="running")
    status = status_of("m-1", "s", sent, None, h.mail["m-1"], STEER, 130.0)
    assert (status["status"], status["reason"], status["delivery"]) == ("accepted", "steer_deadline", "accepted")


def test_past_the_disposal_cutoff_steer_mail_is_left_to_the_disposal():
    h = running(sent_at(100.0), ev.SessionClosing(at=101.0))
    assert fallbacks(decide_keep(KeepObligations("s"), at(h, 500.0))) == []
    assert fallbacks(decide_finish_run(FinishRun("s", "run-1"), at(h, 500.0))) == []
