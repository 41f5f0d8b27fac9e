"""Direct-neighbour routing: who may address whom, whatever the permission rules say. Pure.

A send is routed by direction, not by what the caller passes:

| direction                    | condition                                              | outcome            |
|------------------------------|--------------------------------------------------------|--------------------|
| resident child -> parent     | the sender is resident and continuable, the target is its parent | routed  |
| non-resident child -> parent | the sender is not both, the target is its parent       | refused (own text) |
| parent -> child              | the target's parent is the sender                      | routed             |
| anything else                | siblings, grandchildren, cousins, other trees          | refused            |

Under ``routing = "tree"`` (the default) sends follow the tree scope and the
rules alone; under ``"direct"`` this table comes first. ``interrupt_agent``
always uses it: an interrupt reaches only a direct neighbour.
"""

from collections.abc import Sequence
from dataclasses import dataclass

from ..errors import Code, Rejected
from ..neighbours import Direction, direction, may_address, resident_continuable  # re-exported: the table's rows
from ..records import Peer, SessionRecord

@dataclass(frozen=True)
class Codes:
    """The refusals of one tool, with the verb its messages use."""

    non_resident: Code
    not_neighbour: Code
    verb: str


SEND = Codes(Code.NOT_RESIDENT_CHILD, Code.NOT_DIRECT_NEIGHBOUR, "send to")
INTERRUPT = Codes(Code.INTERRUPT_NOT_RESIDENT_CHILD, Code.INTERRUPT_NOT_DIRECT_NEIGHBOUR, "interrupt")


def require_direct(sender: SessionRecord, target: SessionRecord, codes: Codes = SEND) -> Direction:
    match direction(sender, target):
        case "non_resident_to_parent":
            # Why it is refused, in the refusal itself: such a child's turns have no inbox the parent's reply could reach.
            raise Rejected(
                codes.non_resident,
                f'agent "{sender.session_id}" is not a resident continuable child and cannot {codes.verb} '
                f'parent "{target.session_id}"',
            )
        case "not_neighbour":
            raise Rejected(
                codes.not_neighbour,
                f'agent "{sender.session_id}" can only {codes.verb} its direct children, or its parent when it is '
                f'a resident continuable child; "{target.session_id}" is neither',
            )
        case routed:
            return routed


def require_route(policy: str, sender: SessionRecord, target: SessionRecord) -> None:
    """The send's routing policy: nothing more than the tree scope under "tree"."""
    if policy == "direct":
        require_direct(sender, target, SEND)


def addressable(policy: str, sender: SessionRecord, peers: Sequence[Peer]) -> list[Peer]:
    """The candidate list an unknown reference shows: under "direct", only the direct continuable
    children, and the parent when the sender is a resident continuable child."""
    if policy != "direct":
        return list(peers)
    return [
        p for p in peers
        if (direction(sender, p.record) == "to_child" and p.record.continuable)
        or direction(sender, p.record) == "to_parent"
    ]
