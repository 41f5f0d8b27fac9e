"""interrupt_agent: authorization (rules, routing), the no-op, idempotency, strict arguments. Pure."""

import json
import re
from dataclasses import replace

import pytest

from treemail.domain import actions
from treemail.domain import events as ev
from treemail.domain import state as st
from treemail.domain.commands import FinishRun, InterruptAgent, InterruptArguments, SendContext
from treemail.domain.decide import idempotency, interrupt
from treemail.domain.decide.guards import NoSuchHandle, NoSuchSession
from treemail.domain.decide.lifecycle import decide_finish_run
from treemail.domain.decide.send import Accepted, Refused, outcome_of
from treemail.domain.errors import Code, Rejected
from treemail.domain.handlers import HANDLERS
from treemail.domain.permissions import InvalidRules
from treemail.producers.tools import interrupt as interrupt_tool

from .builders import (History, found, given_lifecycle, registered, registered_as, run_finished, run_started,
                       status_changed, tree)

MAY_INTERRUPT_CHILDREN = [("child", "allow")]


def family(interrupt_rules=MAY_INTERRUPT_CHILDREN):
    t = tree()
    return replace(
        t, root=replace(t.root, interrupt_rules=list(interrupt_rules)),
        child=replace(t.child, interrupt_rules=list(interrupt_rules)),
    )


def decide(sender, target, *, to="x", reason="", run_id="run-1", tool_call_id="call-1", new_id="int-1"):
    command = InterruptAgent(SendContext(sender.session_id, run_id, tool_call_id), InterruptArguments(to, reason))
    # The caller interrupts from its open run (only the exact live agent may interrupt).
    given = interrupt.InterruptGiven(sender, st.fold([registered(sender), run_started(run_id)]), target,
                                     new_id=new_id, now=2.0)
    return HANDLERS[InterruptAgent].decide(command, given)


def code_of(decision) -> Code:
    assert isinstance(decision, Refused), decision
    return decision.code


# ---- the decision ------------------------------------------------------------------------------------


def test_a_running_child_is_interrupted_in_its_current_run():
    t = family()
    decision = decide(t.root, found(t.child, registered(t.child), run_started("run-c7")), reason="wrong file")
    assert isinstance(decision, Accepted)
    assert decision.events == [ev.SessionInterruptRequested(
        at=2.0, interrupt_id="int-1", run_id="run-c7", sender_session_id=t.root.session_id,
        sender_handle=t.root.handle, reason="wrong file", tool_call_id="call-1",
    )]
    assert decision.result["result"] == "interrupt_requested" and decision.result["interrupt_id"] == "int-1"
    assert decision.result["agent"] == t.child.handle


@pytest.mark.parametrize("history, status", [
    ((), "queued"),
    ((run_started("r"), run_finished("r")), "idle"),
    ((run_started("r"), run_finished("r"), status_changed("finished")), "finished"),
])
def test_interrupting_a_session_with_no_run_open_is_a_clear_no_op(history, status):
    t = family()
    decision = decide(t.root, found(t.child, registered(t.child, status="queued"), *history))
    assert isinstance(decision, Accepted) and decision.events == []
    assert decision.result["result"] == "no_op" and decision.result["reason"] == "not_running"
    assert decision.result["recipient_state"] == status and "nothing was done" in decision.result["message"]


@pytest.mark.parametrize("why, history", [
    ("settled", (registered(tree().child), run_started("r"), ev.SessionClosing(stop_reason="aborted"))),
    ("settled", (registered(tree().child), ev.SessionClosing(stop_reason="aborted"), ev.SessionClosed())),
    ("one_shot", (registered_as(tree().child, continuable=False), run_started("r"))),
])
def test_a_settled_or_one_shot_target_is_an_accepted_no_op_that_touches_nothing_even_while_it_runs(why, history):
    """An interrupt whose target is absent, settled, one-shot or already completed is an accepted no-op:
    no event on its stream, and (``is_no_op``) nothing recorded under the tool call."""
    t = family()
    decision = decide(t.root, found(t.child, *history))
    assert isinstance(decision, Accepted) and decision.events == []
    assert (decision.result["result"], decision.result["reason"]) == ("no_op", why)
    assert interrupt.is_no_op(decision) and "nothing was done" in decision.result["message"]


def test_without_interrupt_rules_there_is_no_tool_and_no_interrupt():
    t = family(interrupt_rules=[])
    assert interrupt_tool.tool_definition([]) is None
    assert interrupt_tool.tool_definition([("child", "deny")]) is None
    assert interrupt_tool.tool_definition(MAY_INTERRUPT_CHILDREN)["name"] == "interrupt_agent"
    decision = decide(t.root, found(t.child, registered(t.child), run_started()))
    assert code_of(decision) is Code.INTERRUPT_PERMISSION_DENIED
    assert "no interrupt_agent tool" in decision.message


def test_the_interrupt_rules_decide_by_relationship_and_deny_by_default():
    t = family(interrupt_rules=[("parent", "allow")])
    # The message rules (allow all in this tree) grant nothing to interrupt.
    decision = decide(t.root, found(t.child, registered(t.child), run_started()))
    assert code_of(decision) is Code.INTERRUPT_PERMISSION_DENIED and decision.message.endswith("interrupt your child")
    assert isinstance(decide(t.child, found(t.root, registered(t.root), run_started())), Accepted)


def test_only_a_direct_neighbour_can_be_interrupted_whatever_the_rules_say():
    t = tree()
    everyone = [("*", "allow")]
    root, child = replace(t.root, interrupt_rules=everyone), replace(t.child, interrupt_rules=everyone)
    for sender, target in [(child, t.sibling), (root, t.grandchild), (child, t.stranger)]:
        assert code_of(decide(sender, found(target, registered(target), run_started()))) is \
            Code.INTERRUPT_NOT_DIRECT_NEIGHBOUR
    non_resident = replace(child, resident=False)
    decision = decide(non_resident, found(t.root, registered(t.root), run_started()))
    assert code_of(decision) is Code.INTERRUPT_NOT_RESIDENT_CHILD
    assert decision.message == (
        f'agent "{child.session_id}" is not a resident continuable child and cannot interrupt parent '
        f'"{t.root.session_id}"'
    )


def test_interrupting_an_unknown_agent_is_an_accepted_no_op_and_self_has_its_own_code():
    t = family()
    gone = decide(t.root, NoSuchSession("0190a000-0000-7000-8000-00000000beef"))
    assert isinstance(gone, Accepted) and gone.events == [] and interrupt.is_no_op(gone)
    assert (gone.result["result"], gone.result["reason"], gone.result["agent"]) == ("no_op", "absent", None)
    listed = decide(t.root, NoSuchHandle("nobody_00000000", []))
    assert isinstance(listed, Accepted) and listed.events == []
    assert "nothing was done" in listed.result["message"] and "direct neighbours" in listed.result["message"]
    assert code_of(decide(t.root, found(t.root, registered(t.root), run_started()))) is Code.INTERRUPT_SELF


# ---- idempotency per tool call ----------------------------------------------------------------------


def test_the_interrupt_key_is_the_tool_call_and_never_collides_with_a_send():
    ctx = SendContext("s", "run-1", "call-1")
    assert interrupt.key_digest(ctx) == interrupt.key_digest(SendContext("s", "run-1", "call-1"))
    assert interrupt.key_digest(ctx) != interrupt.key_digest(SendContext("s", "run-1", "call-2"))
    assert interrupt.key_digest(ctx) != idempotency.key_digest(ctx)


def test_a_retried_tool_call_gets_the_first_outcome_and_other_arguments_are_a_conflict():
    t = family()
    first = decide(t.root, found(t.child, registered(t.child), run_started()), to=t.child.handle)
    recorded = interrupt.record(InterruptArguments(t.child.handle), outcome_of(first))
    # The run ended since: deciding again would be a no-op, but the record answers the retry.
    again = decide(t.root, found(t.child, registered(t.child), run_started(), run_finished()), to=t.child.handle,
                   new_id="int-2")
    assert again.result["reason"] == "not_running"
    assert interrupt.replayed_outcome(json.loads(json.dumps(recorded)), InterruptArguments(t.child.handle)) == \
        outcome_of(first)
    conflict = interrupt.replayed_outcome(recorded, InterruptArguments(t.child.handle, "another reason"))
    assert conflict["error"]["code"] == "interrupt_agent:idempotency_conflict"


# ---- the host reports the run aborted ------------------------------------------------------------------


def test_finishing_a_run_records_its_reason_and_older_events_read_as_completed():
    h = History(registered(tree().child), run_started("run-1"))
    [finished] = decide_finish_run(FinishRun("s", "run-1", "aborted"), given_lifecycle(h))
    assert finished == ev.SessionRunFinished(run_id="run-1", reason="aborted")
    [default] = decide_finish_run(FinishRun("s", "run-1"), given_lifecycle(h))
    assert default.reason == "completed"
    assert ev.decode("SessionRunFinished", '{"at": 1.0, "run_id": "r"}').reason == "completed"


def test_the_interrupt_trigger_is_computed_with_the_append():
    event = ev.SessionInterruptRequested(interrupt_id="i", run_id="r", sender_session_id="s", sender_handle="h")
    applied = st.apply(st.fold([registered(tree().child), run_started("r")]), {}, [event], 2)
    assert applied.interrupts == [(3, event)] and applied.wakes == []
    assert applied.state == st.fold([registered(tree().child), run_started("r")])


# ---- rules per action, and the tool's arguments --------------------------------------------------------------


def test_rules_are_flat_message_rules_or_keyed_by_action():
    assert actions.split_actions({"child": "allow"}) == ([("child", "allow")], [])
    assert actions.split_actions("allow") == ([("*", "allow")], [])
    assert actions.split_actions({"message": {"child": "allow"}, "interrupt": {"child": "allow", "*": "deny"}}) == (
        [("child", "allow")], [("child", "allow"), ("*", "deny")]
    )
    assert actions.split_actions({"interrupt": "allow"}) == ([], [("*", "allow")])
    with pytest.raises(InvalidRules, match="allow or deny"):
        actions.split_actions({"interrupt": {"child": "ask"}})
    with pytest.raises(InvalidRules) as caught:
        actions.split_actions({"message": "allow", **{f"act{n}": "allow" for n in range(7)}})
    assert str(caught.value).endswith("rules keyed by action take message and interrupt, got 'act0', 'act1', "
                                      "'act2', 'act3', 'act4' and 2 more")


def test_interrupt_arguments_are_strict():
    assert interrupt_tool.parse_arguments({"to": " explore_1a2b3c4d "}) == InterruptArguments("explore_1a2b3c4d", "")
    assert interrupt_tool.parse_arguments('{"to": "a_00000000", "reason": "stop"}').reason == "stop"
    for bad in [None, [], "not json", {}, {"to": ""}, {"to": 1}, {"to": "a_00000000", "reason": 5},
                {"to": "a_00000000", "body": "x"}, {"to": "a_00000000", "reason": "x" * 1025}, {"to": "\ud800"}]:
        with pytest.raises(Rejected) as caught:
            interrupt_tool.parse_arguments(bad)
        assert caught.value.code is Code.INTERRUPT_INVALID_ARGUMENTS


@pytest.mark.parametrize(
    "rules, named",
    [
        ({"mesage": {"child": "allow"}}, "'mesage'"),
        ({"message": {"child": "allow"}, "delegate": {"child": "allow"}}, "'delegate'"),
        ({"message": {"child": "allow"}, "child": "allow"}, "'child'"),
    ],
)
def test_rules_keyed_by_action_name_the_key_that_is_no_action(rules, named):
    with pytest.raises(InvalidRules, match=re.escape(f"take message and interrupt, got {named}")):
        actions.split_actions(rules)
