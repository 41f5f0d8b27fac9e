"""The fold: counters, snapshots, and tolerance of events it does not know."""

import json
from dataclasses import replace

import pytest

from treemail.domain import events as ev
from treemail.domain import state as st

from .builders import (
    accepted,
    admitted,
    claimed,
    consumed,
    discarded,
    given,
    given_mail,
    registered,
    released,
    run_finished,
    run_started,
    tree,
)

T = tree()


def test_initial_state_is_unregistered_and_empty():
    assert given() == st.INITIAL
    assert not st.INITIAL.registered and st.INITIAL.pending_agent == 0


def test_pending_and_pair_counts_follow_the_lifecycle():
    state = given(
        registered(T.child),
        accepted("a", T.root),
        accepted("b", T.root),
        accepted("c", T.sibling),
        accepted("p", owner="plugin"),
        claimed("a", T.root),
        released("a", T.root),
        consumed("b", T.root),
        discarded("p", owner="plugin"),
    )
    assert state.pending_agent == 2
    assert state.pair_inflight == {T.root.session_id: 1, T.sibling.session_id: 1}


def test_counts_never_go_negative():
    state = given(registered(T.child), consumed("ghost", T.root), discarded("ghost2", T.root))
    assert state.pending_agent == 0 and state.pair_inflight == {}


def test_run_hops_track_the_highest_observed_agent_hop_per_run():
    state = given(
        registered(T.child),
        run_started("r1"),
        admitted("a", T.root, "r1", hop=3),
        claimed("b", T.root, "r1", hop=1),
        claimed("p", None, "r1", owner="goal", hop=99),
        released("a", T.root, "r1", hop=3),
        admitted("c", T.root, "r2", hop=7),
    )
    assert state.run_hops == {"r1": 3, "r2": 7}
    assert given(*[registered(T.child), admitted("a", T.root, "r1", hop=3), run_finished("r1")]).run_hops == {}


def test_an_event_type_the_fold_does_not_know_keeps_the_state():
    class FutureEvent(ev.Event):
        whatever: int = 1

    before = given(registered(T.child), accepted("a", T.root))
    assert st.evolve(before, FutureEvent()) == before
    assert st.evolve_mail({"x": 1}, FutureEvent(), 9) == {"x": 1}


def test_lifecycle_events_for_unknown_mail_leave_the_mail_view_alone():
    assert given_mail(claimed("ghost", T.root), released("ghost", T.root)) == {}


def test_state_and_mail_snapshots_round_trip_through_json():
    events = [registered(T.child), run_started("r1"), accepted("a", T.root, hop=2), claimed("a", T.root, "r1", hop=2)]
    state = given(*events)
    mail = given_mail(*events)
    assert st.SessionState.from_json(state.to_json()) == state
    assert st.SessionState.from_json(None) == st.INITIAL
    assert {k: st.MailItem.from_json(k, v.to_json()) for k, v in mail.items()} == mail


def test_a_mail_item_is_kept_without_its_message_id_and_its_trailing_defaults_and_older_items_read_the_same():
    item = st.MailItem("m1", "agent", "s1", 2, "queue", "accepted", "r1", 7, since=1.5)
    assert json.loads(item.to_json()) == [7, "agent", "s1", 2, "queue", "accepted", "r1", 0, 1.5]
    assert st.MailItem.from_json("m1", item.to_json()) == item
    parked = replace(item, state="parked", attempts=3, reason="timeout")
    assert json.loads(parked.to_json())[-3:] == [0.0, 0.0, "timeout"]
    assert st.MailItem.from_json("m1", parked.to_json()) == parked
    # Written before the compact form: the message id first, every field (or only the first eight).
    full = ["m1", "agent", "s1", 2, "queue", "accepted", "r1", 7, 0, 1.5, 0.0, 0.0, "", ""]
    assert st.MailItem.from_json("m1", json.dumps(full)) == item
    assert st.MailItem.from_json("m1", json.dumps(full[:8])) == replace(item, since=0.0)


def test_a_message_counts_the_claims_that_showed_it_and_a_hand_back_at_a_boundary_shows_nothing():
    def shown(*events) -> int:
        return given_mail(registered(T.child), run_started("r1"), accepted("a", T.root), *events)["a"].shown

    assert shown() == 0
    assert shown(claimed("a", T.root, "r1")) == 1
    # A run cut short (a dropped connection) gives it back shown; the next claim shows it a second time.
    cut = step(ev.ProducerMessageReleased, reason="run_finished")
    assert shown(claimed("a", T.root, "r1"), cut, claimed("a", T.root, "r1")) == 2
    # The host handing it back at a step boundary never showed it.
    handed_back = step(ev.ProducerMessageReleased, reason="released", attempts_change=-1)
    assert shown(claimed("a", T.root, "r1"), handed_back) == 0
    # A retry renews the attempts, not what the model has already seen.
    assert shown(claimed("a", T.root, "r1"), cut, step(ev.ProducerMessageRetried)) == 1


def step(cls, **extra):
    return cls(message_id="a", owner="agent", sender_session_id=T.root.session_id, agent_hop=0, run_id="r1", **extra)


def test_events_round_trip_through_their_stream_encoding():
    for event in [registered(T.child), accepted("a", T.root, hop=2), discarded("a", T.root, reason="x")]:
        assert ev.decode(*ev.encode(event)) == event
    assert ev.decode("SomethingNewer", "{}") is None


def test_an_event_is_stored_without_its_default_fields_and_older_full_entries_read_the_same():
    import json

    event = accepted("a", T.root, hop=2)
    name, data = ev.encode(event)
    stored = json.loads(data)
    assert "proof" not in stored and "blocks" not in stored and stored["agent_hop"] == 2
    # Entries written before defaults were left out carry every field; they decode to the same event.
    assert ev.decode(name, event.model_dump_json()) == ev.decode(name, data) == event


def test_an_agents_message_is_stored_without_what_its_sender_implies_and_reads_back_whole():
    event = accepted("a", T.root, hop=2).model_copy(update={"return_address": T.root.session_id})
    name, data = ev.encode(event)
    stored = json.loads(data)
    assert not {"owner", "producer_id", "return_address"} & set(stored), stored
    decoded = ev.decode(name, data)
    assert decoded == event
    assert (decoded.owner, decoded.producer_id, decoded.return_address) == (
        "agent", f"agent:{T.root.session_id}", T.root.session_id)
    # A protocol-2 entry wrote all three; it reads as the same event.
    assert ev.decode(name, event.model_dump_json()) == event


def test_what_the_sender_does_not_imply_is_stored_and_read_as_written():
    odd = accepted("a", T.root).model_copy(update={"return_address": None, "producer_id": "agent:elsewhere"})
    stored = json.loads(ev.encode(odd)[1])
    assert stored["return_address"] is None and stored["producer_id"] == "agent:elsewhere"
    assert ev.decode(*ev.encode(odd)) == odd
    notice = accepted("n", owner="settlement")
    stored = json.loads(ev.encode(notice)[1])
    assert stored["owner"] == "settlement" and stored["producer_id"] == "settlement:host"
    assert ev.decode(*ev.encode(notice)).return_address is None
    registered_producer = ev.ProducerRegistered(producer_id=f"agent:{T.root.session_id}", owner="agent",
                                                sender_session_id=T.root.session_id)
    assert json.loads(ev.encode(registered_producer)[1]) == {"sender_session_id": T.root.session_id}
    assert ev.decode(*ev.encode(registered_producer)) == registered_producer


def test_an_entry_that_names_no_producer_and_no_agent_sender_is_refused():
    with pytest.raises(ValueError, match="producer_id is required"):
        ev.decode("ProducerMessageAccepted", '{"message_id":"m","owner":"settlement","body":"b","mode":"steer"}')
    with pytest.raises(ValueError, match="producer_id is required"):
        ev.decode("ProducerMessageAccepted", '{"message_id":"m","body":"b","mode":"steer"}')


def test_a_snapshot_from_a_newer_version_with_unknown_fields_still_loads():
    import json

    data = json.loads(given(registered(T.child)).to_json())
    data["field_from_the_future"] = 1
    assert st.SessionState.from_json(json.dumps(data)).registered


def test_a_session_record_round_trips_through_json():
    from treemail.domain.records import SessionRecord

    assert SessionRecord.from_json(T.grandchild.to_json()) == T.grandchild


def test_a_snapshot_keeps_only_what_differs_from_a_new_session_and_reads_back_whole():
    state = st.SessionState(registered=True, status="running", current_run="r-1", pending_all=2)

    assert json.loads(state.to_json()) == {"registered": True, "status": "running", "current_run": "r-1",
                                           "pending_all": 2}
    assert st.SessionState.from_json(state.to_json()) == state
    assert st.SessionState.from_json(st.SessionState(continuable=False).to_json()).continuable is False
    assert json.loads(st.SessionState().to_json()) == {"status": "queued"}  # read inside the server (peers.lua)


def test_an_append_given_the_state_its_decision_folded_leaves_what_folding_again_leaves():
    from treemail.domain.decide.wake import with_wake_folded

    idle = given(registered(T.child, status="idle"))
    events, after = with_wake_folded(idle, [accepted("m-1", T.root)], now=5.0)

    assert st.apply(idle, {}, events, 1, folded=after) == st.apply(idle, {}, events, 1)
    assert [type(e) for e in events][-1] is ev.SessionWakeRequested  # an idle recipient is woken
