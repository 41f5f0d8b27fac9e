"""Effective permissions: labels resolved under the host's session overlay, the deciding rule, visibility. Pure."""

from treemail.domain import effective
from treemail.domain import events as ev
from treemail.domain import state as st
from treemail.domain.commands import OverlayMessageRules
from treemail.domain.decide.rules import decide_overlay_rules
from treemail.domain.decide.send import Accepted, Refused
from treemail.domain.errors import Code
from treemail.domain.records import Peer
from treemail.producers.tools.send_message import tool_definition

from .builders import History, found, given_lifecycle, registered, run_started, send, tree

T = tree()


def overlaid(record, rules) -> tuple[ev.Event, ...]:
    # Sent from its open run (only the exact live sender may send).
    return (registered(record), run_started("run-1"), ev.MessageRulesOverlaid(rules=rules))


def test_each_label_resolves_with_the_rule_that_decided_it():
    rules = [("child", "allow"), ("sib*", "ask")]
    resolved = {label: effective.resolve(rules, [("parent", "deny")], label) for label in effective.LABELS}
    assert resolved["child"] == effective.Resolution("child", "allow", "agent", "child")
    assert resolved["sibling"] == effective.Resolution("sibling", "ask", "agent", "sib*")
    assert resolved["parent"] == effective.Resolution("parent", "deny", "overlay", "parent")
    assert resolved["*"] == effective.Resolution("*", "deny", "default", None)
    assert resolved["*"].describe() == "no rule matches: deny by default"


def test_an_overlay_rule_decides_every_label_it_matches_even_against_a_more_literal_agent_rule():
    assert effective.resolve([("child", "allow")], [("*", "deny")], "child").effect == "deny"


def test_visibility_follows_the_rules_without_an_overlay_and_the_labels_with_one():
    assert effective.visibility([("child", "allow")]).visible
    assert not effective.visibility([]).visible
    assert not effective.visibility([("child", "allow")], send_message_tool=False).visible
    assert not effective.visibility([("child", "allow")], overlay=[("*", "deny")]).visible
    assert effective.visibility([], overlay=[("parent", "allow")]).visible


def test_the_overlay_is_a_command_decided_into_an_event_and_folded_into_state():
    h = History(registered(T.child))
    events = h.then(decide_overlay_rules(OverlayMessageRules(T.child.session_id, [("parent", "deny")]),
                                         given_lifecycle(h)))
    assert events == [ev.MessageRulesOverlaid(rules=[("parent", "deny")])]
    assert h.state.rules_overlay == (("parent", "deny"),)
    # the same overlay again changes nothing; an empty one removes it
    assert decide_overlay_rules(OverlayMessageRules(T.child.session_id, [("parent", "deny")]), given_lifecycle(h)) == []
    h.then(decide_overlay_rules(OverlayMessageRules(T.child.session_id, []), given_lifecycle(h)))
    assert h.state.rules_overlay == ()
    assert st.SessionState.from_json(h.state.to_json()) == h.state


def test_sends_decide_on_the_overlay_a_deny_overlay_denies_an_allowed_label():
    decision = send(T.child, found(T.root), sender_events=overlaid(T.child, [("parent", "deny")]))
    assert isinstance(decision, Refused) and decision.code is Code.PERMISSION_DENIED


def test_sends_decide_on_the_overlay_an_allow_overlay_opens_a_session_without_rules():
    mute = T.with_rules("child", []).child
    assert send(mute, found(T.root)).code is Code.PERMISSION_DENIED
    assert isinstance(send(mute, found(T.root), sender_events=overlaid(mute, [("parent", "allow")])), Accepted)


def test_the_tool_definition_follows_the_overlay():
    assert tool_definition([("child", "allow")], True, overlay=[("*", "deny")]) is None
    assert tool_definition([], True, overlay=[("parent", "ask")])["name"] == "send_message"


def test_the_report_shows_visibility_and_what_each_label_covers_and_which_rule_decided():
    child = T.with_rules("child", [("parent", "allow"), ("*", "deny")]).child
    peers = [Peer(T.root, "running"), Peer(T.sibling, "idle"), Peer(T.grandchild, "queued")]
    data = effective.report(child, [("sibling", "ask")], peers)
    assert data["tool"]["visible"] is True
    assert data["labels"]["parent"] == {"effect": "allow", "source": "agent", "rule": "parent",
                                        "decided_by": "agent rule 'parent': allow", "sessions": [T.root.handle]}
    assert data["labels"]["sibling"]["source"] == "overlay" and data["labels"]["sibling"]["effect"] == "ask"
    assert data["labels"]["child"]["sessions"] == [T.grandchild.handle]
    assert data["labels"]["*"]["effect"] == "deny" and data["labels"]["*"]["rule"] == "*"
    text = effective.render_report(data)
    assert "send_message tool: visible" in text
    assert f"sibling  ask   by overlay rule 'sibling': ask; covers {T.sibling.handle}" in text
