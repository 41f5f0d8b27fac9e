"""Host-side lifecycle deciders: start run, claim, consume, release, discard, finish run, status, inject."""

import pytest

from treemail.domain.errors import LifecycleError
from treemail.domain import events as ev
from treemail.domain import state as st
from treemail.domain.commands import (
    ChangeStatus,
    ClaimMail,
    ConsumeMail,
    DiscardMail,
    FinishRun,
    InjectMail,
    ReleaseMail,
    StartRun,
)
from treemail.domain.decide.lifecycle import (
    Given,
    decide_claim,
    decide_consume,
    decide_discard,
    decide_finish_run,
    decide_inject,
    decide_release,
    decide_start_run,
    decide_status,
)

from .builders import (
    History,
    accepted,
    config,
    registered,
    run_started,
    tree,
)

T = tree()


def session(*events, status="idle") -> History:
    return History(registered(T.child, status=status), *events)


def ids(events, cls) -> list[str]:
    return [e.message_id for e in events if isinstance(e, cls)]


def lifecycle_code(call) -> str:
    with pytest.raises(LifecycleError) as caught:
        call()
    return caught.value.code


# ---- start run -------------------------------------------------------------------------------


def test_start_run_admits_pending_unclaimed_mail_in_acceptance_order():
    h = session(
        accepted("m-b", T.root, mode="queue"),
        accepted("m-a", T.sibling, mode="steer"),
        accepted("m-c", owner="plugin", mode="queue"),
    )

    events = h.then(decide_start_run(StartRun("s", "run-1"), Given(h.state, h.mail, config())))

    assert events[0] == ev.SessionRunStarted(run_id="run-1")
    assert ids(events, ev.ProducerMessageAdmitted) == ["m-b", "m-a", "m-c"]
    assert all(e.run_id == "run-1" for e in events[1:])
    assert h.state.status == "running" and h.state.current_run == "run-1"
    assert {m.state for m in h.mail.values()} == {"admitted"}


def test_start_run_is_idempotent_for_the_current_run():
    h = session(run_started("run-1"))
    assert decide_start_run(StartRun("s", "run-1"), Given(h.state, h.mail, config())) == []


def test_start_run_while_another_run_is_active_is_refused():
    h = session(run_started("run-1"))
    assert lifecycle_code(lambda: decide_start_run(StartRun("s", "run-2"), Given(h.state, h.mail, config()))) == "lifecycle:run_active"


def test_lifecycle_on_an_unregistered_session_is_refused():
    state, mail = st.INITIAL, {}
    assert lifecycle_code(lambda: decide_start_run(StartRun("s", "r"), Given(state, mail, config()))) == "lifecycle:unknown_session"
    assert lifecycle_code(lambda: decide_claim(ClaimMail("s", "r"), Given(state, mail, config()))) == "lifecycle:unknown_session"
    assert lifecycle_code(lambda: decide_status(ChangeStatus("s", "idle"), Given(state, {}, config()))) == "lifecycle:unknown_session"
    assert lifecycle_code(lambda: decide_inject(InjectMail("s", "i", "plugin", "x", "queue"), Given(state, {}, config()))) == (
        "lifecycle:unknown_session"
    )


# ---- claim -----------------------------------------------------------------------------------


def test_claim_returns_admitted_mail_in_acceptance_order():
    h = session(accepted("m-1", T.root, mode="queue"), accepted("m-2", T.sibling, mode="queue"))
    h.then(decide_start_run(StartRun("s", "run-1"), Given(h.state, h.mail, config())))

    events = h.then(decide_claim(ClaimMail("s", "run-1"), Given(h.state, h.mail, config())))

    assert ids(events, ev.ProducerMessageClaimed) == ["m-1", "m-2"]
    assert all(m.state == "claimed" and m.run_id == "run-1" for m in h.mail.values())
    assert decide_claim(ClaimMail("s", "run-1"), Given(h.state, h.mail, config())) == []  # nothing due twice


def test_steer_mail_joins_the_current_run_but_queue_mail_waits_for_the_next():
    h = session()
    h.then(decide_start_run(StartRun("s", "run-1"), Given(h.state, h.mail, config())))
    h.then([accepted("m-queue", T.root, mode="queue"), accepted("m-steer", T.root, mode="steer")])

    claimed_now = h.then(decide_claim(ClaimMail("s", "run-1"), Given(h.state, h.mail, config())))
    assert ids(claimed_now, ev.ProducerMessageClaimed) == ["m-steer"]
    h.then(decide_consume(ConsumeMail("s", "m-steer"), Given(h.state, h.mail, config())))

    h.then(decide_finish_run(FinishRun("s", "run-1"), Given(h.state, h.mail, config())))
    h.then(decide_start_run(StartRun("s", "run-2"), Given(h.state, h.mail, config())))
    assert ids(h.then(decide_claim(ClaimMail("s", "run-2"), Given(h.state, h.mail, config()))), ev.ProducerMessageClaimed) == ["m-queue"]


def test_released_mail_is_due_at_the_next_boundary_and_failed_mail_once_its_backoff_is_over():
    h = session()
    h.then(decide_start_run(StartRun("s", "run-1"), Given(h.state, h.mail, config())))
    h.then([accepted("m-1", T.root)])
    h.then(decide_claim(ClaimMail("s", "run-1"), Given(h.state, h.mail, config(), now=100.0)))
    h.then(decide_release(ReleaseMail("s", "m-1"), Given(h.state, h.mail, config(), now=100.0)))
    # A release at a step boundary is not a failure: due at the very next boundary.
    assert ids(h.then(decide_claim(ClaimMail("s", "run-1"), Given(h.state, h.mail, config(), now=100.0))),
               ev.ProducerMessageClaimed) == ["m-1"]
    h.then(decide_finish_run(FinishRun("s", "run-1"), Given(h.state, h.mail, config(), now=100.0)))
    h.then(decide_start_run(StartRun("s", "run-2"), Given(h.state, h.mail, config(), now=100.0)))

    # Backoff: the first failed attempt waits backoff_initial_s (1 s) before it is due again.
    assert decide_claim(ClaimMail("s", "run-2"), Given(h.state, h.mail, config(), now=100.5)) == []
    assert ids(decide_claim(ClaimMail("s", "run-2"), Given(h.state, h.mail, config(), now=101.0)),
               ev.ProducerMessageClaimed) == ["m-1"]


def test_claim_on_a_run_that_is_not_current_is_refused():
    h = session(run_started("run-1"))
    assert lifecycle_code(lambda: decide_claim(ClaimMail("s", "run-0"), Given(h.state, h.mail, config()))) == "lifecycle:not_current_run"
    idle = session()
    assert lifecycle_code(lambda: decide_claim(ClaimMail("s", "run-1"), Given(idle.state, idle.mail, config()))) == "lifecycle:not_current_run"


def test_mail_admitted_to_another_run_is_not_claimed_by_this_one():
    h = session(accepted("m-1", T.root, mode="queue"))
    h.then(decide_start_run(StartRun("s", "run-1"), Given(h.state, h.mail, config())))
    h.then(decide_finish_run(FinishRun("s", "run-1"), Given(h.state, h.mail, config())))  # admitted to run-1, never claimed
    h.then([run_started("run-2")])
    assert decide_claim(ClaimMail("s", "run-2"), Given(h.state, h.mail, config())) == []


# ---- consume / release / discard -------------------------------------------------------------


@pytest.fixture
def claimed_mail() -> History:
    h = session(accepted("m-1", T.root, hop=2))
    h.then(decide_start_run(StartRun("s", "run-1"), Given(h.state, h.mail, config())))
    h.then(decide_claim(ClaimMail("s", "run-1"), Given(h.state, h.mail, config())))
    return h


def test_consume_acknowledges_claimed_mail_and_frees_its_slots(claimed_mail):
    h = claimed_mail
    events = h.then(decide_consume(ConsumeMail("s", "m-1"), Given(h.state, h.mail, config())))

    assert events == [
        ev.ProducerMessageConsumed(
            message_id="m-1", owner="agent", sender_session_id=T.root.session_id, agent_hop=2, run_id="run-1"
        )
    ]
    assert h.mail == {}
    assert h.state.pending_agent == 0 and h.state.pair_inflight == {}
    assert h.state.run_hops == {"run-1": 2}


def test_release_keeps_the_slots(claimed_mail):
    h = claimed_mail
    h.then(decide_release(ReleaseMail("s", "m-1"), Given(h.state, h.mail, config())))
    assert h.mail["m-1"].state == "released"
    assert h.state.pending_agent == 1 and h.state.pair_inflight == {T.root.session_id: 1}


def test_a_release_records_the_hosts_reason_as_the_latest_reason(claimed_mail):
    h = claimed_mail
    [released] = h.then(decide_release(ReleaseMail("s", "m-1", "rate_limited: 429"), Given(h.state, h.mail, config())))
    assert (released.reason, released.detail) == ("released", "rate_limited: 429")
    assert h.mail["m-1"].reason == "rate_limited: 429"


def test_a_release_without_a_reason_keeps_treemails_own_code(claimed_mail):
    h = claimed_mail
    [released] = h.then(decide_release(ReleaseMail("s", "m-1"), Given(h.state, h.mail, config())))
    assert released.detail == "" and h.mail["m-1"].reason == "released"


@pytest.mark.parametrize("reason", ["x" * 201, "two\nlines", "tab\there"])
def test_a_release_reason_longer_than_its_bound_or_not_one_line_is_refused(claimed_mail, reason):
    h = claimed_mail
    given = Given(h.state, h.mail, config())
    assert lifecycle_code(lambda: decide_release(ReleaseMail("s", "m-1", reason), given)) == "lifecycle:invalid_reason"
    assert decide_release(ReleaseMail("s", "m-1", "x" * 200), given)  # the bound itself passes


@pytest.mark.parametrize("decide", [
    lambda state, mail, message_id: decide_consume(ConsumeMail("s", message_id), Given(state, mail, config())),
    lambda state, mail, message_id: decide_release(ReleaseMail("s", message_id), Given(state, mail, config())),
])
@pytest.mark.parametrize("stage", ["accepted", "admitted", "released"])
def test_consume_and_release_require_claimed_mail(decide, stage):
    h = session(accepted("m-1", T.root, mode="queue"))
    if stage != "accepted":
        h.then(decide_start_run(StartRun("s", "run-1"), Given(h.state, h.mail, config())))
    if stage == "released":
        h.then(decide_claim(ClaimMail("s", "run-1"), Given(h.state, h.mail, config())))
        h.then(decide_release(ReleaseMail("s", "m-1"), Given(h.state, h.mail, config())))
    assert h.mail["m-1"].state == stage
    assert lifecycle_code(lambda: decide(h.state, h.mail, "m-1")) == "lifecycle:not_claimed"


@pytest.mark.parametrize(
    "decide",
    [
        lambda s, m: decide_consume(ConsumeMail("s", "m-404"), Given(s, m, config())),
        lambda s, m: decide_release(ReleaseMail("s", "m-404"), Given(s, m, config())),
        lambda s, m: decide_discard(DiscardMail("s", "m-404", "gone"), Given(s, m, config())),
    ],
)
def test_an_unknown_message_is_refused(decide):
    h = session(accepted("m-1", T.root))
    assert lifecycle_code(lambda: decide(h.state, h.mail)) == "lifecycle:unknown_message"


def test_consumed_mail_is_no_longer_known(claimed_mail):
    h = claimed_mail
    h.then(decide_consume(ConsumeMail("s", "m-1"), Given(h.state, h.mail, config())))
    assert lifecycle_code(lambda: decide_consume(ConsumeMail("s", "m-1"), Given(h.state, h.mail, config()))) == "lifecycle:unknown_message"


def test_discard_works_in_any_pending_state_and_frees_the_slots():
    h = session(accepted("m-1", T.root))
    events = h.then(decide_discard(DiscardMail("s", "m-1", "recipient finished"), Given(h.state, h.mail, config())))
    assert [type(e) for e in events] == [ev.ProducerMessageDiscarded]
    assert events[0].reason == "recipient finished"
    assert h.mail == {} and h.state.pending_agent == 0 and h.state.pair_inflight == {}


# ---- finish run ------------------------------------------------------------------------------


def test_finish_run_releases_mail_that_run_claimed_but_never_acknowledged():
    h = session(accepted("m-1", T.root), accepted("m-2", T.sibling), accepted("m-3", T.root))
    h.then(decide_start_run(StartRun("s", "run-1"), Given(h.state, h.mail, config())))
    h.then(decide_claim(ClaimMail("s", "run-1"), Given(h.state, h.mail, config())))
    h.then(decide_consume(ConsumeMail("s", "m-2"), Given(h.state, h.mail, config())))

    events = h.then(decide_finish_run(FinishRun("s", "run-1"), Given(h.state, h.mail, config())))

    assert ids(events, ev.ProducerMessageReleased) == ["m-1", "m-3"]
    assert events[-1] == ev.SessionRunFinished(run_id="run-1")
    # A failed attempt: due again after its backoff (the pump wakes the session then), not at once.
    assert h.state.current_run is None and h.state.status == "idle" and not h.state.wake_pending
    assert {(m.state, m.retry_at) for m in h.mail.values()} == {("released", 1.0)}


def test_finish_run_of_a_run_that_is_not_current_is_refused():
    h = session(run_started("run-1"))
    assert lifecycle_code(lambda: decide_finish_run(FinishRun("s", "run-0"), Given(h.state, h.mail, config()))) == "lifecycle:not_current_run"


def test_released_mail_from_a_finished_run_is_admitted_to_the_next():
    h = session(accepted("m-1", T.root))
    h.then(decide_start_run(StartRun("s", "run-1"), Given(h.state, h.mail, config())))
    h.then(decide_claim(ClaimMail("s", "run-1"), Given(h.state, h.mail, config())))
    h.then(decide_finish_run(FinishRun("s", "run-1"), Given(h.state, h.mail, config())))

    events = h.then(decide_start_run(StartRun("s", "run-2"), Given(h.state, h.mail, config(), now=1.0)))

    assert ids(events, ev.ProducerMessageAdmitted) == ["m-1"]
    assert ids(decide_claim(ClaimMail("s", "run-2"), Given(h.state, h.mail, config(), now=1.0)),
               ev.ProducerMessageClaimed) == ["m-1"]


# ---- status and inject -----------------------------------------------------------------------


def test_status_change_is_emitted_only_when_it_changes():
    h = session(status="idle")
    assert decide_status(ChangeStatus("s", "idle"), Given(h.state, {}, config())) == []
    assert h.then(decide_status(ChangeStatus("s", "finished"), Given(h.state, {}, config()))) == [ev.SessionStatusChanged(status="finished")]
    assert h.state.status == "finished"


@pytest.mark.parametrize("owner", ["plugin", "delegation", "goal"])
def test_inject_registers_its_host_producer_once_and_is_never_counted(owner):
    h = session(status="running")  # a running session needs no wake: only the mail events follow
    first = h.then(decide_inject(InjectMail("s", "i-1", owner, "note", "queue"), Given(h.state, {}, config())))
    second = h.then(decide_inject(InjectMail("s", "i-2", owner, "note", "steer"), Given(h.state, {}, config())))

    assert [type(e) for e in first] == [ev.ProducerRegistered, ev.ProducerMessageAccepted]
    assert [type(e) for e in second] == [ev.ProducerMessageAccepted]
    assert first[0].producer_id == f"{owner}:host"
    assert h.state.pending_agent == 0 and h.state.pair_inflight == {}
    assert set(h.mail) == {"i-1", "i-2"}


def test_inject_has_its_own_body_cap():
    h = session()
    cfg = config(max_body_bytes=1, max_injected_body_bytes=4)
    assert decide_inject(InjectMail("s", "i-1", "plugin", "abcd", "queue"), Given(h.state, {}, cfg))
    too_long = lambda: decide_inject(InjectMail("s", "i-2", "plugin", "abcde", "queue"), Given(h.state, {}, cfg))
    assert lifecycle_code(too_long) == "lifecycle:invalid_body"
    empty = lambda: decide_inject(InjectMail("s", "i-3", "plugin", "", "queue"), Given(h.state, {}, cfg))
    assert lifecycle_code(empty) == "lifecycle:invalid_body"
