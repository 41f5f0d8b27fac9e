"""Relationship labels, rule precedence, visibility. Pure."""

import re

import pytest

from treemail.domain.permissions import InvalidRules, Origin, evaluate, normalize_rules, relationship, tool_visible
from treemail.producers.tools.send_message import tool_definition

from .builders import tree

T = tree()


@pytest.mark.parametrize(
    "sender, recipient, label",
    [
        (T.child, T.root, "parent"),
        (T.root, T.child, "child"),
        (T.child, T.grandchild, "child"),
        (T.grandchild, T.child, "parent"),
        (T.child, T.sibling, "sibling"),
        (T.sibling, T.child, "sibling"),
        (T.grandchild, T.root, "*"),  # grandparent
        (T.root, T.grandchild, "*"),  # grandchild
        (T.grandchild, T.sibling, "*"),  # uncle
        (T.root, T.stranger, "*"),  # two roots are not siblings
    ],
)
def test_the_label_is_the_recipients_relationship_to_the_sender(sender, recipient, label):
    assert relationship(sender.origin, recipient.origin) == label


def test_two_roots_without_parents_are_not_siblings():
    assert relationship(Origin("a", None), Origin("b", None)) == "*"


@pytest.mark.parametrize(
    "rules, label, effect",
    [
        ([], "child", "deny"),  # default deny
        ([("sibling", "allow")], "child", "deny"),
        ([("*", "allow"), ("child", "deny")], "child", "deny"),  # literal beats wildcard
        ([("child", "deny"), ("*", "allow")], "child", "deny"),  # regardless of order
        ([("chil?", "allow"), ("c*", "deny")], "child", "allow"),  # more literal characters win
        ([("c*d", "allow"), ("c?i*", "deny")], "child", "allow"),  # 2 literals each: fewer wildcards win
        ([("*", "allow"), ("*", "ask")], "parent", "ask"),  # tie: later declaration wins
        ([("*", "ask"), ("*", "allow")], "parent", "allow"),
        ([("parent", "ask"), ("parent", "deny")], "parent", "deny"),
        ([("*", "allow")], "*", "allow"),
        ([("sib*", "ask")], "sibling", "ask"),
    ],
)
def test_precedence(rules, label, effect):
    assert evaluate(normalize_rules(rules), label) == effect


def test_a_wildcard_pattern_matches_the_whole_label_only():
    assert evaluate([("chi", "allow")], "child") == "deny"
    assert evaluate([("?", "allow")], "child") == "deny"


@pytest.mark.parametrize("effect", ["allow", "ask", "deny"])
def test_a_bare_effect_means_star(effect):
    assert normalize_rules(effect) == [("*", effect)]
    assert normalize_rules({"*": effect}) == [("*", effect)]


def test_mapping_rules_keep_declaration_order():
    assert normalize_rules({"child": "allow", "parent": "ask", "*": "deny"}) == [
        ("child", "allow"),
        ("parent", "ask"),
        ("*", "deny"),
    ]
    assert normalize_rules(None) == []
    assert normalize_rules([["child", "allow"]]) == [("child", "allow")]


@pytest.mark.parametrize(
    "rules",
    ["permit", "Allow", {"child": "yes"}, {"child": None}, [("child", "maybe")], {"": "allow"}],
)
def test_an_invalid_rule_raises_invalid_rules(rules):
    with pytest.raises(InvalidRules):
        normalize_rules(rules)


@pytest.mark.parametrize(
    "rules, visible",
    [
        ([], False),
        ([("*", "deny")], False),
        ([("child", "deny"), ("*", "deny")], False),
        ([("child", "allow")], True),
        ([("sibling", "ask"), ("*", "deny")], True),
    ],
)
def test_the_tool_is_visible_only_with_an_allow_or_ask_rule(rules, visible):
    assert tool_visible(rules) is visible
    assert (tool_definition(rules) is not None) is visible


def test_the_tool_is_hidden_when_the_agent_document_turns_it_off():
    assert tool_definition([("*", "allow")], send_message_tool=False) is None


@pytest.mark.parametrize("pattern", ["chlid", "parents", "explore_*", "x?"])
def test_a_pattern_no_relationship_can_match_is_refused_by_name(pattern):
    with pytest.raises(InvalidRules, match=re.escape(f"{pattern!r} matches no relationship")):
        normalize_rules({pattern: "allow"})


@pytest.mark.parametrize("pattern", ["*", "?????", "p*", "*ing", "child"])
def test_a_pattern_that_matches_some_relationship_is_kept(pattern):
    assert normalize_rules({pattern: "allow"}) == [(pattern, "allow")]
