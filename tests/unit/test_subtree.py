"""Whole subtrees: who a broadcast reaches, the bottom-up order of a cascading stop, their decisions. Pure."""

import pytest

from treemail.domain import events as ev
from treemail.domain import state as st
from treemail.domain.commands import (BroadcastToSubtree, CloseSession, InterruptRun, RecordBroadcastDelivery,
                                      SealSession, StopSubtree)
from treemail.domain.decide import subtree
from treemail.domain.decide.lifecycle import Given
from treemail.domain.errors import Code, LifecycleError, Rejected
from treemail.domain.handlers import HANDLERS
from treemail.producers.tools import subtree as subtree_tool

from .builders import accepted, closing, config, given_mail, registered, run_started, session_record

ROOT = "00000000-0000-7000-8000-000000000000"


def sid(n: int) -> str:
    return f"00000000-0000-7000-8000-{n:012d}"


def family():
    """root -> a (-> a1 -> a11, a2), b (-> b1); and another root's session that is no one's descendant."""
    root = session_record(ROOT, agent_type="lead")
    a = session_record(sid(10), root=ROOT, parent=ROOT)
    b = session_record(sid(20), root=ROOT, parent=ROOT)
    a1 = session_record(sid(11), root=ROOT, parent=a.session_id)
    a2 = session_record(sid(12), root=ROOT, parent=a.session_id)
    b1 = session_record(sid(21), root=ROOT, parent=b.session_id)
    a11 = session_record(sid(111), root=ROOT, parent=a1.session_id)
    return {"root": root, "a": a, "b": b, "a1": a1, "a2": a2, "b1": b1, "a11": a11}


def names(records, f):
    by_id = {r.session_id: name for name, r in f.items()}
    return [by_id[r.session_id] for r in records]


def decide(command, *events, now=3.0):
    return HANDLERS[type(command)].decide(command, Given(st.fold(events), {}, config(), now))


# ---- who and in which order ----------------------------------------------------------------------------


def test_a_broadcast_reaches_every_descendant_top_down_and_never_the_sender_or_another_branch():
    f = family()
    records = list(reversed(f.values()))  # the tree index's order does not matter
    assert names(subtree.descendants(f["root"], records), f) == ["a", "b", "a1", "a2", "b1", "a11"]
    assert names(subtree.descendants(f["a"], records), f) == ["a1", "a2", "a11"]
    assert subtree.descendants(f["a11"], records) == []


def test_a_cascading_stop_puts_every_session_after_all_of_its_descendants_the_top_last():
    f = family()
    order = subtree.bottom_up(f["root"], list(f.values()))
    assert names(order, f) == ["a11", "a1", "a2", "b1", "a", "b", "root"]
    position = {r.session_id: i for i, r in enumerate(order)}
    for record in order:
        if record.parent_session_id in position:
            assert position[record.session_id] < position[record.parent_session_id]
    assert names(subtree.bottom_up(f["b"], list(f.values())), f) == ["b1", "b"]


def test_each_copy_has_its_own_key_and_the_same_one_on_every_resumption():
    assert subtree.copy_call("b1", sid(10)) == subtree.copy_call("b1", sid(10))
    assert subtree.copy_call("b1", sid(10)) != subtree.copy_call("b1", sid(20))
    assert subtree.copy_call("b1", sid(10)) != subtree.copy_call("b2", sid(10))


# ---- the decisions --------------------------------------------------------------------------------------


def test_a_broadcast_is_recorded_with_its_recipients_fixed_at_the_decision():
    f = family()
    command = BroadcastToSubtree(ROOT, "bc-1", "run-1", "stop and report", "queue", (sid(10), sid(20)), "call-1")
    events = decide(command, registered(f["root"]), run_started("run-1"))
    assert events == [ev.SubtreeBroadcastStarted(at=3.0, broadcast_id="bc-1", run_id="run-1", body="stop and report",
                                                 mode="queue", recipients=[sid(10), sid(20)], tool_call_id="call-1")]
    # Folding it changes nothing the session's other decisions read.
    before = st.fold([registered(f["root"]), run_started("run-1")])
    assert st.evolve(before, events[0]) == before


@pytest.mark.parametrize("run", [None, "run-0"])
def test_only_the_senders_open_run_may_broadcast(run):
    f = family()
    events = [registered(f["root"])] + ([run_started(run)] if run else [])
    with pytest.raises(Rejected) as refused:
        decide(BroadcastToSubtree(ROOT, "bc-1", "run-1", "hi", "steer", ()), *events)
    assert refused.value.code == Code.SUBTREE_SENDER_NOT_LIVE


def test_a_broadcast_from_an_unregistered_session_is_refused():
    with pytest.raises(Rejected) as refused:
        decide(BroadcastToSubtree(ROOT, "bc-1", "run-1", "hi", "steer", ()))
    assert refused.value.code == Code.SUBTREE_UNKNOWN_SESSION


def test_what_became_of_each_copy_is_recorded():
    f = family()
    events = decide(RecordBroadcastDelivery(ROOT, "bc-1", ((sid(10), "m1"),), ((sid(20), "send_message:inbox_full"),)),
                    registered(f["root"]))
    assert events == [ev.SubtreeBroadcastDelivered(at=3.0, broadcast_id="bc-1", accepted={sid(10): "m1"},
                                                   refused={sid(20): "send_message:inbox_full"})]


def test_a_stop_records_its_order_and_refuses_an_unknown_way_to_stop():
    f = family()
    events = decide(StopSubtree(ROOT, "st-1", "dispose", (sid(10), ROOT), "aborted"), registered(f["root"]))
    assert events == [ev.SubtreeStopStarted(at=3.0, stop_id="st-1", how="dispose", order=[sid(10), ROOT],
                                            reason="aborted")]
    with pytest.raises(LifecycleError) as refused:
        decide(StopSubtree(ROOT, "st-1", "explode", (ROOT,)), registered(f["root"]))
    assert refused.value.code == "lifecycle:invalid_stop"


def test_a_cascading_interrupt_stops_the_open_run_and_leaves_a_session_with_none_as_it_is():
    f = family()
    command = InterruptRun(sid(10), "int-1", ROOT, "lead_00000000", "the plan changed")
    assert decide(command, registered(f["a"]), run_started("run-a")) == [ev.SessionInterruptRequested(
        at=3.0, interrupt_id="int-1", run_id="run-a", sender_session_id=ROOT, sender_handle="lead_00000000",
        reason="the plan changed",
    )]
    assert decide(command, registered(f["a"], status="idle")) == []
    # Past its disposal cutoff there is nothing left to interrupt: the disposal ends the run.
    assert decide(command, registered(f["a"]), run_started("run-a"), closing()) == []


# ---- the tool's strict arguments ------------------------------------------------------------------------


def test_the_tool_takes_a_body_and_an_optional_mode_and_nothing_else():
    assert subtree_tool.parse_arguments({"body": "hi"}) == ("hi", "steer")
    assert subtree_tool.parse_arguments('{"body": "hi", "mode": "queue"}') == ("hi", "queue")
    for bad in ({}, {"body": 3}, {"body": "hi", "mode": "later"}, {"body": "hi", "to": "x"}, "[1]", "nope"):
        with pytest.raises(Rejected) as refused:
            subtree_tool.parse_arguments(bad)
        assert refused.value.code == Code.SUBTREE_INVALID_ARGUMENTS
    assert subtree_tool.tool_definition()["input_schema"]["additionalProperties"] is False


# ---- closed for good ---------------------------------------------------------------------------------------


def registration_of(child, parent_record, *parent_events):
    """The registration of ``child`` decided with its parent read as ``parent_events`` fold."""
    from treemail.domain.commands import RegisterSession
    from treemail.domain.handlers import decide_command
    from treemail.domain.outbound import Sender

    command = RegisterSession(session_id=child.session_id, root_session_id=ROOT, parent_session_id=
                              parent_record.session_id, agent_type="worker", description="", handle=None, rules=[],
                              send_message_tool=True, status="queued")
    parent = Sender(parent_record, st.fold([registered(parent_record), *parent_events]), 1 + len(parent_events))
    given = Given(st.INITIAL, {}, config(), 3.0, session_id=child.session_id,
                  senders={parent_record.session_id: parent})
    return decide_command(command, given)


def test_a_stop_seals_each_session_once_and_a_sealed_parent_takes_no_new_child():
    f = family()
    seal = SealSession(f["a"].session_id, "st-1")
    [sealed] = decide(seal, registered(f["a"]))
    assert sealed == ev.SessionSealed(at=3.0, stop_id="st-1")
    assert decide(SealSession(f["a"].session_id, "st-2"), registered(f["a"]), sealed) == []
    with pytest.raises(LifecycleError) as refused:
        registration_of(f["a11"], f["a"], sealed)
    assert refused.value.code == "lifecycle:parent_stopped"


def test_a_registration_holds_its_parents_stream_so_a_seal_in_between_makes_it_decide_again():
    f = family()
    decision = registration_of(f["a11"], f["a"])
    [registered_event] = decision.events
    assert isinstance(registered_event, ev.SessionRegistered)
    # The parent joins the atomic step with no event: its etag is checked, nothing is written there.
    [held] = decision.sources
    assert held.record.session_id == f["a"].session_id and held.events == []


def test_a_sealed_session_returns_the_mail_held_for_its_next_incarnation_and_is_never_resumed():
    f = family()
    a1 = f["a1"]
    held = accepted("m-held", f["a"]).model_copy(update={"next_incarnation": True})
    history = [registered(a1), closing(), held]
    close = CloseSession(a1.session_id, returned=(("m-held", "returned to its sender as notice n-1"),))
    mail = given_mail(*history)
    ordinary = HANDLERS[CloseSession].decide(CloseSession(a1.session_id), Given(st.fold(history), mail, config(), 3.0))
    assert ev.SessionResumed in {type(e) for e in ordinary}
    sealed = [*history, ev.SessionSealed(stop_id="st-1")]
    with pytest.raises(LifecycleError) as unreturned:
        HANDLERS[CloseSession].decide(CloseSession(a1.session_id), Given(st.fold(sealed), mail, config(), 3.0))
    assert unreturned.value.code == "lifecycle:unreturned_mail"
    events = HANDLERS[CloseSession].decide(close, Given(st.fold(sealed), mail, config(), 3.0))
    assert [type(e) for e in events] == [ev.ProducerMessageDiscarded, ev.SessionClosed]
    assert events[0].reason == "returned to its sender as notice n-1"


def test_a_fork_under_a_sealed_parent_is_refused_as_a_registration_is():
    from treemail.domain.commands import ForkSession, RegisterSession
    from treemail.domain.handlers import decide_command
    from treemail.domain.outbound import Sender

    f = family()
    registration = RegisterSession(session_id=sid(112), root_session_id=ROOT, parent_session_id=f["a1"].session_id,
                                   agent_type="worker", description="", handle=None, rules=[],
                                   send_message_tool=True, status="idle")
    parent = Sender(f["a1"], st.fold([registered(f["a1"]), ev.SessionSealed(stop_id="st-1")]), 2)
    given = Given(st.INITIAL, {}, config(), 3.0, history=((1, registered(f["a11"])),), session_id=sid(112),
                  senders={f["a1"].session_id: parent})
    assert HANDLERS[ForkSession].reads_senders(ForkSession(registration, f["a11"].session_id, 1), {}, ()) == {
        f["a1"].session_id}
    with pytest.raises(LifecycleError) as refused:
        decide_command(ForkSession(registration, f["a11"].session_id, 1), given)
    assert refused.value.code == "lifecycle:parent_stopped"


def test_every_recipient_of_a_broadcast_is_delivered_or_refused_with_a_code_never_neither():
    from treemail.producers.host.subtree import accounted

    f = family()
    recipients = [f[name].session_id for name in ("a", "a1", "b", "b1")]
    results = [{"message_id": "m-a", "recipient_state": "queued"},
               {"error": {"code": "send_message:recipient_closing", "message": "stopped for good"}},
               {"result": "something else"},  # neither: refused all the same
               {}]
    delivered, refused = accounted(recipients, results, {f["a"].session_id: f["a"]})
    assert [d["session_id"] for d in delivered] == [f["a"].session_id]
    assert {r["session_id"]: r["code"] for r in refused} == {
        f["a1"].session_id: "send_message:recipient_closing",
        f["b"].session_id: Code.SUBTREE_ENGINE_SHUTDOWN.value, f["b1"].session_id: Code.SUBTREE_ENGINE_SHUTDOWN.value}
