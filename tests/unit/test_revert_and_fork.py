"""Revert and fork, given/when/then on the pure deciders: mail follows the session's log.

A ``Stream`` keeps what the event store keeps: the events at their 1-based
positions, and beside them the snapshot and the pending-mail hash updated only
through ``state.apply`` (the live path). Every test can compare that live
state with a full fold of the stream (a replay).
"""

from collections import Counter

import pytest
from hypothesis import given as hypothesis_given
from hypothesis import settings
from hypothesis import strategies as st

from treemail.domain import events as ev
from treemail.domain import state as sm
from treemail.domain.commands import (
    ClaimMail,
    ConsumeMail,
    DiscardMail,
    FinishRun,
    ForkSession,
    RegisterSession,
    ReleaseMail,
    RevertSession,
    StartRun,
)
from treemail.domain.decide import guards
from treemail.domain.decide.delivery import deadline_of
from treemail.domain.decide.mailcontrol import is_expired
from treemail.domain.decide.wake import has_mail_due_while_asleep
from treemail.domain.decide.branches import decide_fork, decide_revert, reverted_at
from treemail.domain.decide.lifecycle import (
    Given,
    decide_claim,
    decide_consume,
    decide_discard,
    decide_finish_run,
    decide_release,
    decide_start_run,
)
from treemail.domain.decide.send import Accepted, Refused
from treemail.domain.decide.wake import with_wake
from treemail.domain.errors import Code, LifecycleError
from treemail.projections.views import PROJECTIONS, fold_event

from .builders import accepted, config, found, registered, send, tree

T = tree()


class Stream:
    """One session stream, with its snapshot and mail hash maintained as the live path does."""

    def __init__(self, *events: ev.Event) -> None:
        self.events: list[ev.Event] = []
        self.state = sm.INITIAL
        self.mail: dict[str, sm.MailItem] = {}
        self.append(list(events))

    @property
    def version(self) -> int:
        return len(self.events)

    @property
    def history(self) -> list[tuple[int, ev.Event]]:
        return list(enumerate(self.events, start=1))

    def append(self, new_events: list[ev.Event]) -> list[ev.Event]:
        applied = sm.apply(self.state, self.mail, new_events, self.version)
        self.events.extend(new_events)
        self.state = applied.state
        for message_id, item in applied.mail_changes.items():  # HSET / HDEL, as commit.lua does
            if item is None:
                self.mail.pop(message_id, None)
            else:
                self.mail[message_id] = item
        return new_events

    def given(self, with_history: bool = False) -> Given:
        return Given(self.state, dict(self.mail), config(), 0.0, tuple(self.history) if with_history else ())

    def do(self, decide, command, with_history: bool = False) -> list[ev.Event]:
        return self.append(decide(command, self.given(with_history)))

    def revert(self, to_position: int) -> list[ev.Event]:
        return self.do(decide_revert, RevertSession("s", to_position), with_history=True)

    def replayed(self) -> tuple[sm.SessionState, dict[str, sm.MailItem]]:
        mail: dict[str, sm.MailItem] = {}
        for seq, event in self.history:
            mail = sm.evolve_mail(mail, event, seq)
        return sm.fold(self.events), mail


def child_stream(*events: ev.Event, status: str = "idle") -> Stream:
    return Stream(registered(T.child, status=status), *events)


def of(events, cls) -> list[str]:
    return [e.message_id for e in events if isinstance(e, cls)]


def code_of(call) -> str:
    with pytest.raises(LifecycleError) as caught:
        call()
    return caught.value.code


def run(s: Stream, run_id: str) -> None:
    s.do(decide_start_run, StartRun("s", run_id))


def claim(s: Stream, run_id: str) -> list[str]:
    return of(s.do(decide_claim, ClaimMail("s", run_id)), ev.ProducerMessageClaimed)


def consume(s: Stream, message_id: str) -> None:
    s.do(decide_consume, ConsumeMail("s", message_id))


def finish(s: Stream, run_id: str) -> None:
    s.do(decide_finish_run, FinishRun("s", run_id))


# ---- revert ----------------------------------------------------------------------------------------


def test_revert_restores_mail_consumed_after_the_cut_and_keeps_what_was_consumed_before():
    s = child_stream(accepted("m-1", T.root), accepted("m-2", T.sibling))
    run(s, "run-1")
    claim(s, "run-1")
    consume(s, "m-1")
    cut = s.version
    consume(s, "m-2")
    finish(s, "run-1")

    events = s.revert(cut)

    assert isinstance(events[0], ev.SessionReverted) and events[0].to_position == cut
    assert of(events, ev.ProducerMessageRestored) == ["m-2"]
    assert set(s.mail) == {"m-2"} and s.mail["m-2"].state == "released"
    assert s.state.pending_agent == 1 and s.state.pair_inflight == {T.sibling.session_id: 1}
    assert s.replayed() == (s.state, s.mail)


def test_mail_accepted_after_the_cut_is_not_lost_by_a_revert():
    s = child_stream(accepted("m-1", T.root))
    cut = s.version
    s.append([accepted("m-2", T.root, mode="queue")])
    run(s, "run-1")
    claim(s, "run-1")
    consume(s, "m-1")
    consume(s, "m-2")
    finish(s, "run-1")

    s.revert(cut)

    assert [m.message_id for m in sorted(s.mail.values(), key=lambda m: m.seq)] == ["m-1", "m-2"]
    assert s.state.pending_agent == 2
    assert s.replayed() == (s.state, s.mail)


def test_revert_releases_the_claims_of_the_open_run_and_ends_it_then_wakes_the_session():
    s = child_stream(accepted("m-1", T.root))
    run(s, "run-1")
    cut = s.version
    claim(s, "run-1")

    events = s.revert(cut)

    assert [type(e) for e in events] == [
        ev.SessionReverted, ev.ProducerMessageReleased, ev.SessionRunFinished, ev.SessionWakeRequested,
    ]
    assert s.state.current_run is None and s.state.status == "idle" and s.state.wake_pending
    assert s.state.run_hops == {}
    # The next run gets the mail again.
    run(s, "run-2")
    assert claim(s, "run-2") == ["m-1"]
    assert s.replayed() == (s.state, s.mail)


def test_discards_after_the_cut_stand():
    s = child_stream(accepted("m-1", T.root), accepted("m-2", T.root))
    cut = s.version
    s.do(decide_discard, DiscardMail("s", "m-1", "host dropped it"))
    assert of(s.revert(cut), ev.ProducerMessageRestored) == []
    assert set(s.mail) == {"m-2"}


def test_restored_mail_has_a_deadline_from_the_restore_and_keeps_the_expiry_its_acceptance_gave_it():
    expiring = accepted("m-1", T.root).model_copy(update={"at": 100.0, "expires_at": 160.0, "urgent": True})
    s = child_stream(expiring, accepted("m-2", T.root).model_copy(update={"at": 100.0}))
    cut = s.version
    run(s, "run-1")
    claim(s, "run-1")
    consume(s, "m-1")
    consume(s, "m-2")
    finish(s, "run-1")

    s.append(decide_revert(RevertSession("s", cut), Given(s.state, dict(s.mail), config(), 5000.0,
                                                           tuple(s.history))))

    restored, plain = s.mail["m-1"], s.mail["m-2"]
    # Due again with a budget of attempts from the restore: its deadline parks it like any message, where
    # an item with no start had none and was woken for ever.
    assert (restored.since, plain.since) == (5000.0, 5000.0)
    assert deadline_of(plain, config()) == 5000.0 + config().delivery_deadline_s
    # Expired an hour ago: its expiry still ends it, and claims pass it over.
    assert (restored.expires_at, restored.urgent, plain.expires_at) == (160.0, True, 0.0)
    assert is_expired(restored, 5000.0) and not is_expired(plain, 5000.0)
    assert s.replayed() == (s.state, s.mail)


def test_restored_mail_is_claimed_again_in_acceptance_order():
    s = child_stream(accepted("m-1", T.root), accepted("m-2", T.sibling), accepted("m-3", owner="plugin"))
    cut = s.version
    run(s, "run-1")
    claim(s, "run-1")
    for message_id in ("m-3", "m-1", "m-2"):
        consume(s, message_id)
    finish(s, "run-1")

    s.revert(cut)
    run(s, "run-2")

    assert claim(s, "run-2") == ["m-1", "m-2", "m-3"]


def test_a_repeated_revert_to_the_same_position_appends_nothing():
    s = child_stream(accepted("m-1", T.root))
    cut = s.version
    run(s, "run-1")
    claim(s, "run-1")
    consume(s, "m-1")
    assert s.revert(cut)
    assert decide_revert(RevertSession("s", cut), s.given(with_history=True)) == []
    assert decide_revert(RevertSession("s", s.version), s.given(with_history=True)) == []  # nothing after it


def test_a_second_revert_further_back_restores_mail_consumed_since_the_first():
    s = child_stream(accepted("m-1", T.root), accepted("m-2", T.root))
    early = s.version
    run(s, "run-1")
    claim(s, "run-1")
    consume(s, "m-1")
    late = s.version
    consume(s, "m-2")
    finish(s, "run-1")
    assert of(s.revert(late), ev.ProducerMessageRestored) == ["m-2"]
    run(s, "run-2")
    claim(s, "run-2")
    consume(s, "m-2")
    finish(s, "run-2")

    assert of(s.revert(early), ev.ProducerMessageRestored) == ["m-1", "m-2"]
    assert s.state.pending_agent == 2
    assert s.replayed() == (s.state, s.mail)


def test_revert_to_a_position_outside_the_history_or_on_a_reverted_branch_is_refused():
    s = child_stream(accepted("m-1", T.root))
    cut = s.version
    run(s, "run-1")
    on_branch = s.version
    finish(s, "run-1")
    s.revert(cut)

    for position in (0, s.version + 1, on_branch):
        assert code_of(lambda: decide_revert(RevertSession("s", position), s.given(True))) == (
            "lifecycle:invalid_position"
        )
    assert reverted_at(s.history, on_branch) is not None and reverted_at(s.history, cut) is None


def test_revert_of_an_unregistered_session_is_refused():
    assert code_of(lambda: decide_revert(RevertSession("s", 1), Given(sm.INITIAL, {}, config()))) == (
        "lifecycle:unknown_session"
    )


# ---- guards, windows and hops after a revert ------------------------------------------------------


def test_restored_mail_counts_against_the_inbox_cap_and_the_pair_window_again():
    s = child_stream(accepted("m-1", T.root))
    cut = s.version
    run(s, "run-1")
    claim(s, "run-1")
    consume(s, "m-1")
    finish(s, "run-1")
    assert isinstance(send(T.root, found(T.child, *s.events), cfg=config(max_inflight_per_pair=1)), Accepted)

    s.revert(cut)

    window = send(T.root, found(T.child, *s.events), cfg=config(max_inflight_per_pair=1))
    inbox = send(T.root, found(T.child, *s.events), cfg=config(max_pending_per_session=1))
    assert isinstance(window, Refused) and window.code == Code.INFLIGHT_FULL
    assert isinstance(inbox, Refused) and inbox.code == Code.INBOX_FULL


def test_hops_observed_on_a_reverted_branch_by_the_run_it_ended_no_longer_count():
    s = child_stream(accepted("m-1", T.root, hop=3))
    run(s, "run-1")
    cut = s.version
    claim(s, "run-1")
    assert guards.sending_hop(s.state, "run-1") == 4
    s.revert(cut)
    assert guards.sending_hop(s.state, "run-1") == 0


# ---- fork ------------------------------------------------------------------------------------------


def fork_command(at_position: int, handle: str = "explore_f0000001") -> ForkSession:
    registration = RegisterSession(
        session_id="fork-1", root_session_id=T.child.root_session_id, parent_session_id=T.child.parent_session_id,
        agent_type=T.child.agent_type, description=T.child.description, handle=handle, rules=T.child.rules,
        send_message_tool=True, status="idle",
    )
    return ForkSession(registration, T.child.session_id, at_position)


def test_fork_registers_a_new_session_of_the_same_tree_without_the_sources_pending_mail():
    source = child_stream(accepted("m-1", T.root))
    fork = Stream()

    events = fork.append(decide_fork(fork_command(source.version), Given(fork.state, {}, config(), 0.0,
                                                                          tuple(source.history))))

    assert [type(e) for e in events] == [ev.SessionRegistered, ev.SessionForked]
    assert events[0].root_session_id == T.child.root_session_id and events[0].handle == "explore_f0000001"
    assert events[1] == ev.SessionForked(source_session_id=T.child.session_id, at_position=source.version)
    assert fork.mail == {} and fork.state.pending_agent == 0 and fork.state.registered
    assert set(source.mail) == {"m-1"}  # delivered once, where it was sent
    assert decide_fork(fork_command(1), fork.given(True)) == []  # a repeated fork appends nothing


def test_fork_at_a_position_outside_the_sources_live_history_is_refused():
    source = child_stream(accepted("m-1", T.root))
    cut = source.version
    run(source, "run-1")
    on_branch = source.version
    finish(source, "run-1")
    source.revert(cut)
    history = tuple(source.history)

    for position in (0, source.version + 1, on_branch):
        assert code_of(lambda: decide_fork(fork_command(position), Given(sm.INITIAL, {}, config(), 0.0, history))) == (
            "lifecycle:invalid_position"
        )
    assert code_of(lambda: decide_fork(fork_command(1), Given(sm.INITIAL, {}, config()))) == "lifecycle:unknown_session"


# ---- live equals replay, against an independent model ---------------------------------------------

SENDERS = [T.root, T.sibling]


@settings(max_examples=150, deadline=None)
@hypothesis_given(st.data())
def test_live_state_equals_a_full_replay_and_the_mail_model_after_any_reverts(data):
    """Pending mail = accepted - discarded - consumed on the live line (positions no revert abandoned)."""
    s = child_stream()
    abandoned: list[tuple[int, int]] = []
    counter = 0
    for _ in range(data.draw(st.integers(1, 40))):
        step = data.draw(st.sampled_from(["accept", "accept", "start", "claim", "consume", "release",
                                          "discard", "finish", "revert", "revert"]))
        run_id = s.state.current_run
        claimed = sorted(m for m, item in s.mail.items() if item.state == "claimed")
        if step == "accept":
            counter += 1
            owner = data.draw(st.sampled_from(["agent", "agent", "plugin"]))
            s.append(with_wake(s.state, [accepted(f"m-{counter}", data.draw(st.sampled_from(SENDERS)), owner=owner,
                                                  mode=data.draw(st.sampled_from(["steer", "queue"])))]))
        elif step == "start" and run_id is None:
            counter += 1
            run(s, f"run-{counter}")
        elif step == "claim" and run_id is not None:
            claim(s, run_id)
        elif step in ("consume", "release") and claimed:
            message_id = data.draw(st.sampled_from(claimed))
            s.do(decide_consume if step == "consume" else decide_release,
                 (ConsumeMail if step == "consume" else ReleaseMail)("s", message_id))
        elif step == "discard" and s.mail:
            s.do(decide_discard, DiscardMail("s", data.draw(st.sampled_from(sorted(s.mail))), "x"))
        elif step == "finish" and run_id is not None:
            finish(s, run_id)
        elif step == "revert":
            live = [p for p in range(1, s.version + 1) if not any(a < p <= b for a, b in abandoned)]
            to = data.draw(st.sampled_from(live))
            before = s.version
            if s.revert(to):
                abandoned.append((to, before))

        assert s.replayed() == (s.state, s.mail)
        on_live_line = [(p, e) for p, e in s.history if not any(a < p <= b for a, b in abandoned)]
        accepted_all = {e.message_id: e for e in s.events if isinstance(e, ev.ProducerMessageAccepted)}
        discarded = {e.message_id for e in s.events if isinstance(e, ev.ProducerMessageDiscarded)}
        consumed = {e.message_id for _, e in on_live_line if isinstance(e, ev.ProducerMessageConsumed)}
        pending = {m: e for m, e in accepted_all.items() if m not in discarded | consumed}
        assert set(s.mail) == set(pending)
        agent = [e for e in pending.values() if e.owner == "agent"]
        assert s.state.pending_agent == len(agent) and s.state.pending_all == len(pending)
        assert s.state.pair_inflight == dict(Counter(e.sender_session_id for e in agent))
        # The projections fold the same stream to the same counts.
        views = {name: {} for name in PROJECTIONS}
        for seq, event in s.history:
            for name, projection in PROJECTIONS.items():
                fold_event(views[name], projection, "s", seq, event)
        assert int(views["inbox"].get("s", 0)) == s.state.pending_agent
        assert {k.split(">")[0]: int(v) for k, v in views["pairs"].items() if ">" in k} == s.state.pair_inflight
        assert int(views["trees"].get(f"{T.child.root_session_id}:pending", 0)) == s.state.pending_all
        # Asleep with mail deliverable now always has a wake outstanding (mail in its backoff after a
        # failed attempt waits for the delivery pump, which wakes the session when the backoff ends).
        if s.state.status == "idle" and has_mail_due_while_asleep(s.state, s.mail, 0.0):
            assert s.state.wake_pending
