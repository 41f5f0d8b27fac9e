"""Whole subtrees: who a broadcast reaches, the bottom-up order of a cascading stop, their decisions. Pure."""

import pytest

from treemail.domain import events as ev
from treemail.domain import state as st
from treemail.domain.commands import BroadcastToSubtree, InterruptRun, RecordBroadcastDelivery, StopSubtree
from treemail.domain.decide import subtree
from treemail.domain.decide.lifecycle import Given
from treemail.domain.errors import Code, LifecycleError, Rejected
from treemail.domain.handlers import HANDLERS
from treemail.producers.tools import subtree as subtree_tool

from .builders import closing, config, registered, run_started, session_record

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
