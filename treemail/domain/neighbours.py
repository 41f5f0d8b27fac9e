"""Who is whose direct neighbour in a delegation tree, and whom a routing policy lets a session address. Pure.

Below the deciders because more than a send reads it: a notice teaches a child to report to its parent only
when the policy lets it (``notices``), and the send's routing guard refuses by the same table
(``decide/routing``).
"""

from typing import Literal

from .records import SessionRecord

Direction = Literal["to_parent", "to_child", "non_resident_to_parent", "not_neighbour"]


def resident_continuable(record: SessionRecord) -> bool:
    return record.resident and record.continuable


def direction(sender: SessionRecord, target: SessionRecord) -> Direction:
    """Which row of the routing table (``decide/routing``) a message from ``sender`` to ``target`` falls in."""
    if sender.root_session_id != target.root_session_id or sender.session_id == target.session_id:
        return "not_neighbour"
    if sender.parent_session_id is not None and target.session_id == sender.parent_session_id:
        return "to_parent" if resident_continuable(sender) else "non_resident_to_parent"
    if target.parent_session_id == sender.session_id:
        return "to_child"
    return "not_neighbour"


def may_address(policy: str, sender: SessionRecord, target: SessionRecord) -> bool:
    """Whether ``sender`` may send to ``target`` by routing alone (the rules still apply)."""
    if policy != "direct":
        return sender.root_session_id == target.root_session_id and sender.session_id != target.session_id
    return direction(sender, target) in ("to_parent", "to_child")
