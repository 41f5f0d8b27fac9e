"""A turn boundary of an agent whose run lasts as long as its connection: queued mail is due there too."""

import dataclasses

import pytest

from treemail.domain import events as ev
from treemail.domain.commands import ClaimMail, ClaimTurn, StartRun
from treemail.domain.errors import LifecycleError
from treemail.domain.decide.lifecycle import Given, decide_claim, decide_claim_turn, decide_start_run
from treemail.domain.handlers import HANDLERS

from .builders import History, accepted, config, registered, tree

T = tree()


def running() -> History:
    h = History(registered(T.child, status="idle"))
    h.then(decide_start_run(StartRun("s", "run-1"), Given(h.state, h.mail, config())))
    return h


def claimed(events) -> list[str]:
    return [e.message_id for e in events if isinstance(e, ev.ProducerMessageClaimed)]


def test_a_turn_claims_queued_mail_that_a_step_boundary_leaves_for_the_next_run():
    h = running()
    h.then([accepted("m-queue", T.root, mode="queue"), accepted("m-steer", T.sibling, mode="steer")])

    assert claimed(decide_claim(ClaimMail("s", "run-1"), Given(h.state, h.mail, config()))) == ["m-steer"]
    events = h.then(decide_claim_turn(ClaimTurn("s", "run-1"), Given(h.state, h.mail, config())))

    assert claimed(events) == ["m-queue", "m-steer"]  # acceptance order
    assert all(e.run_id == "run-1" for e in events)
    assert decide_claim_turn(ClaimTurn("s", "run-1"), Given(h.state, h.mail, config())) == []  # nothing twice


def test_a_turn_waits_out_a_failed_attempts_backoff_and_is_refused_for_a_run_that_is_not_current():
    h = running()
    h.then([accepted("m-1", T.root, mode="queue")])

    backing_off = {k: dataclasses.replace(v, retry_at=50.0) for k, v in h.mail.items()}
    assert decide_claim_turn(ClaimTurn("s", "run-1"), Given(h.state, backing_off, config(), now=49.0)) == []
    assert claimed(decide_claim_turn(ClaimTurn("s", "run-1"), Given(h.state, backing_off, config(), now=50.0))) == ["m-1"]

    with pytest.raises(LifecycleError) as caught:
        decide_claim_turn(ClaimTurn("s", "run-0"), Given(h.state, h.mail, config()))
    assert caught.value.code == "lifecycle:not_current_run"


def test_a_turn_reads_all_pending_mail_since_queued_mail_is_outside_the_due_index():
    assert HANDLERS[ClaimTurn].reads_mail == "all"
