"""Direct-neighbour routing: every row of the routing table, the policy switch, the surface. Pure."""

from dataclasses import replace

import pytest

from treemail.domain.decide import routing
from treemail.domain.decide.send import Accepted, Refused
from treemail.domain.errors import Code
from treemail.domain.records import Peer
from treemail.producers.tools.send_message import DESCRIPTION, tool_definition

from .builders import config, found, send, tree

DIRECT = config(routing="direct")


def not_resident(record):
    return replace(record, resident=False)


def refused(decision) -> Refused:
    assert isinstance(decision, Refused), decision
    return decision


# ---- the routing table, under routing = "direct" ---------------------------------------------


def test_a_resident_continuable_child_may_send_to_its_parent():
    t = tree()
    assert isinstance(send(t.child, found(t.root), cfg=DIRECT), Accepted)


@pytest.mark.parametrize("flags", [{"resident": False}, {"continuable": False}, {"resident": False, "continuable": False}])
def test_a_child_that_is_not_resident_and_continuable_is_refused_with_its_stable_message(flags):
    t = tree()
    child = replace(t.child, **flags)
    decision = refused(send(child, found(t.root), cfg=DIRECT))
    assert decision.code is Code.NOT_RESIDENT_CHILD
    assert decision.message == (
        f'agent "{child.session_id}" is not a resident continuable child and cannot send to parent '
        f'"{t.root.session_id}"'
    )


@pytest.mark.parametrize("child_flags", [{}, {"resident": False}, {"continuable": False}])
def test_a_parent_may_send_to_its_direct_child(child_flags):
    t = tree()
    assert isinstance(send(t.root, found(replace(t.child, **child_flags)), cfg=DIRECT), Accepted)
    assert isinstance(send(t.child, found(t.grandchild), cfg=DIRECT), Accepted)


@pytest.mark.parametrize("sender, recipient", [
    ("child", "sibling"),       # siblings
    ("root", "grandchild"),     # a grandchild is not a direct child
    ("grandchild", "root"),     # nor a grandparent a direct parent
    ("sibling", "grandchild"),  # an uncle
])
def test_anything_else_is_refused_whatever_the_rules_say(sender, recipient):
    t = tree(rules=[("*", "allow")])
    decision = refused(send(getattr(t, sender), found(getattr(t, recipient)), cfg=DIRECT))
    assert decision.code is Code.NOT_DIRECT_NEIGHBOUR
    assert "is neither" in decision.message


def test_routing_is_decided_before_the_rules_and_the_rules_still_apply_to_neighbours():
    t = tree(rules=[("parent", "allow"), ("sibling", "deny"), ("child", "deny")])
    # A denied sibling is refused by routing, not by permissions: the policy comes first.
    assert refused(send(t.child, found(t.sibling), cfg=DIRECT)).code is Code.NOT_DIRECT_NEIGHBOUR
    # A neighbour the rules deny stays denied.
    assert refused(send(t.root, found(t.child), cfg=DIRECT)).code is Code.PERMISSION_DENIED


def test_a_cross_tree_send_keeps_its_own_code():
    t = tree()
    assert refused(send(t.root, found(t.stranger), cfg=DIRECT)).code is Code.NOT_TREE_PEER


# ---- routing = "tree" (the default) is today's behaviour ------------------------------------------


def test_tree_routing_lets_siblings_and_non_resident_children_send_as_the_rules_allow():
    t = tree()
    assert config().routing == "tree"
    assert isinstance(send(t.child, found(t.sibling)), Accepted)
    assert isinstance(send(not_resident(t.child), found(t.root)), Accepted)
    assert isinstance(send(t.root, found(t.grandchild)), Accepted)


# ---- the table as a pure function, and the candidate list ------------------------------------------


def test_direction_names_each_row_of_the_table():
    t = tree()
    assert routing.direction(t.child, t.root) == "to_parent"
    assert routing.direction(not_resident(t.child), t.root) == "non_resident_to_parent"
    assert routing.direction(t.root, t.child) == "to_child"
    assert routing.direction(t.child, t.sibling) == "not_neighbour"
    assert routing.direction(t.child, t.child) == "not_neighbour"
    assert routing.direction(t.root, t.stranger) == "not_neighbour"


def test_the_candidate_list_under_direct_routing_shows_only_direct_continuable_children_and_the_parent():
    t = tree()
    one_shot = replace(t.grandchild, continuable=False)
    peers = [Peer(r, "running") for r in (t.root, t.sibling, t.grandchild)]
    listed = routing.addressable("direct", t.child, peers)
    assert [p.record.session_id for p in listed] == [t.root.session_id, t.grandchild.session_id]
    # A non-resident child does not see its parent; a one-shot child is not listed to its parent.
    assert routing.addressable("direct", not_resident(t.child), peers) == [peers[2]]
    assert routing.addressable("direct", t.child, [Peer(one_shot, "running")]) == []
    # Tree routing lists every peer, as before.
    assert routing.addressable("tree", t.child, peers) == peers


def test_may_address_follows_the_policy():
    t = tree()
    assert routing.may_address("tree", t.child, t.sibling)
    assert not routing.may_address("direct", t.child, t.sibling)
    assert routing.may_address("direct", t.root, t.child)
    assert not routing.may_address("direct", not_resident(t.child), t.root)


# ---- the tool follows the policy ------------------------------------------------------------------------


def test_the_default_tool_is_exactly_the_plain_send_message_tool():
    default = tool_definition([("*", "allow")])
    assert default == tool_definition([("*", "allow")], True, "tree", False)
    assert default["description"] == DESCRIPTION
    assert default["input_schema"]["properties"]["to"] == {
        "type": "string", "minLength": 1, "description": "Recipient handle or full session id."
    }
    assert default["input_schema"]["properties"]["body"]["type"] == "string"


def test_under_direct_routing_the_tool_describes_only_direct_neighbours():
    tool = tool_definition([("*", "allow")], routing="direct")
    to = tool["input_schema"]["properties"]["to"]["description"]
    assert to == (
        "The handle or session id of your direct continuable child, or of your direct parent when you are a "
        "resident continuable child."
    )
    assert "direct continuable child" in tool["description"] and "peers" not in tool["description"]


def test_the_policy_and_blocks_are_deployment_settings_with_checked_values():
    from treemail.adapters.config import load_config
    from treemail.domain.errors import ConfigError

    loaded = load_config(environ={"TREEMAIL_MESSAGING_ROUTING": "direct", "TREEMAIL_MESSAGING_CONTENT_BLOCKS": "true"})
    assert (loaded.messaging.routing, loaded.messaging.content_blocks) == ("direct", True)
    assert (load_config(environ={}).messaging.routing, load_config(environ={}).messaging.content_blocks) == (
        "tree", False)
    with pytest.raises(ConfigError, match="messaging.routing"):
        load_config(environ={"TREEMAIL_MESSAGING_ROUTING": "neighbours"})
