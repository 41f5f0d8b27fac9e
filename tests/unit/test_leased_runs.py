"""A leased run's life (an agent over streamable HTTP): its calls renew it, the pump finishes it once they stop
for ``mcp_idle_s``, its unconfirmed claims due again as attempts. Given/when/then on the pure decisions."""

import pytest

from treemail.domain import events as ev
from treemail.domain.commands import ClaimTurn, KeepObligations, RenewRun
from treemail.domain.decide.delivery import next_check
from treemail.domain.decide.leasedruns import IDLE, decide_keep_with_idle, decide_renew_run
from treemail.domain.decide.lifecycle import Given, decide_claim_turn
from treemail.domain.errors import LifecycleError
from treemail.domain.messaging import MessagingConfig

from .builders import History, accepted, config, registered, run_started, tree

T = tree()
RUN = "mcp-http:run-1"
CFG = config(mcp_lease_s=60, mcp_idle_s=600)


def leased_at(start: float, *events) -> History:
    started = run_started(RUN).model_copy(update={"at": start})
    return History(registered(T.child, status="queued"), started, *events)


def at(h: History, now: float) -> Given:
    return Given(h.state, h.mail, CFG, now)


def kinds(events) -> list[str]:
    return [type(e).__name__ for e in events]


def test_a_call_is_recorded_only_once_a_tenth_of_the_idle_time_passed_since_the_last_record():
    h = leased_at(100.0)
    assert decide_renew_run(RenewRun("s", RUN), at(h, 159.0)) == []  # 59 s: still fresh
    (renewed,) = h.then(decide_renew_run(RenewRun("s", RUN), at(h, 160.0)))
    assert (type(renewed), renewed.run_id, h.state.run_seen_at) == (ev.SessionRunRenewed, RUN, 160.0)
    assert decide_renew_run(RenewRun("s", RUN), at(h, 161.0)) == []  # a second request of the same moment


def test_only_the_current_leased_run_is_renewed():
    h = leased_at(0.0)
    with pytest.raises(LifecycleError, match="not_current_run"):
        decide_renew_run(RenewRun("s", "mcp-http:older"), at(h, 500.0))
    engine = History(registered(T.child, status="queued"), run_started("engine-run"))
    with pytest.raises(LifecycleError, match="not_leased"):
        decide_renew_run(RenewRun("s", "engine-run"), Given(engine.state, engine.mail, CFG, 500.0))


def test_the_pump_finishes_a_leased_run_with_no_call_for_the_idle_time_and_not_a_moment_before():
    h = leased_at(100.0)
    assert next_check(h.state, [], CFG, 100.0) == 700.0  # the due index brings the pump back then
    assert decide_keep_with_idle(KeepObligations("s"), at(h, 699.0)) == []
    (finished,) = h.then(decide_keep_with_idle(KeepObligations("s"), at(h, 700.0)))
    assert (type(finished), finished.run_id, finished.reason) == (ev.SessionRunFinished, RUN, IDLE)
    assert (h.state.status, h.state.current_run, h.state.run_seen_at) == ("idle", None, 0.0)
    assert next_check(h.state, [], CFG, 700.0) is None  # nothing left for the pump


def test_a_renewed_run_lasts_the_idle_time_from_its_last_record():
    h = leased_at(0.0)
    h.then(decide_renew_run(RenewRun("s", RUN), at(h, 500.0)))
    assert decide_keep_with_idle(KeepObligations("s"), at(h, 1099.0)) == []
    assert kinds(decide_keep_with_idle(KeepObligations("s"), at(h, 1100.0))) == ["SessionRunFinished"]


def test_an_idle_runs_unconfirmed_claims_are_due_again_as_counted_attempts_with_a_wake_and_nothing_is_lost():
    h = leased_at(0.0, accepted("m-1", T.root, mode="queue"))
    h.then(decide_claim_turn(ClaimTurn("s", RUN), at(h, 10.0)))
    assert h.mail["m-1"].attempts == 1
    # A lease longer than the idle time is refused by the configuration, so the claim ends with its lease
    # (the pump's first look), and the run with its idleness (a later one).
    released = h.then(decide_keep_with_idle(KeepObligations("s"), at(h, 70.0)))
    assert [(type(e), e.reason) for e in released] == [(ev.ProducerMessageReleased, "attempt_timeout")]
    events = h.then(decide_keep_with_idle(KeepObligations("s"), at(h, 600.0)))
    assert kinds(events) == ["SessionRunFinished", "SessionWakeRequested"]
    assert (h.mail["m-1"].state, h.mail["m-1"].attempts) == ("released", 1)


def test_an_idle_run_finished_holding_a_claim_releases_it_at_once_counted():
    h = leased_at(0.0, accepted("m-1", T.root, mode="queue"))
    h.then(decide_claim_turn(ClaimTurn("s", RUN), at(h, 0.0)))
    long_lease = MessagingConfig(mcp_lease_s=600, mcp_idle_s=600)
    events = h.then(decide_keep_with_idle(KeepObligations("s"), Given(h.state, h.mail, long_lease, 600.0)))
    # The lease and the idleness end together: the claim fails first (its attempt counted), then the run ends.
    assert kinds(events)[:1] == ["ProducerMessageReleased"] and "SessionRunFinished" in kinds(events)
    assert h.mail["m-1"].state == "released" and h.state.current_run is None


def test_an_engines_run_is_never_finished_for_idleness():
    h = History(registered(T.child, status="queued"), run_started("engine-run"))
    assert decide_keep_with_idle(KeepObligations("s"), Given(h.state, h.mail, CFG, 10**9)) == []


def test_the_idle_time_may_not_be_shorter_than_the_lease():
    with pytest.raises(ValueError, match="mcp_idle_s"):
        MessagingConfig(mcp_lease_s=60, mcp_idle_s=30)
    assert MessagingConfig().mcp_idle_s == 600.0
