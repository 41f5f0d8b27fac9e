"""Bringing a running cluster to a slot plan (``slotplan``): which of its masters takes each planned master's
place, and which slot ranges move from which master to which.

Starting from how a cluster's slots are owned now (each master's ranges; an even split when it was made by
``valkey-cli --cluster create``), each planned master is matched to the current master it shares the most
slots with, so the fewest slots move; a move names the partitions and command streams whose tags it
carries (the trees' keys move with their partition's slot). Pure, as the plan is.
"""

from dataclasses import dataclass

from .slotplan import SLOTS, MasterPlan, SlotPlan, tagged_slots


def even_split(masters: int) -> list[tuple[int, int]]:
    """The ranges ``valkey-cli --cluster create`` gives ``masters`` masters: 16384 / masters each, rounded."""
    per = SLOTS / masters
    out, first, cursor = [], 0, 0.0
    for i in range(masters):
        last = SLOTS - 1 if i == masters - 1 else min(int(cursor + per - 1 + 0.5), SLOTS - 1)
        last = max(last, first)
        out.append((first, last))
        first, cursor = last + 1, cursor + per
    return out


@dataclass(frozen=True)
class Move:
    """Slots ``first``..``last`` go from master ``source`` to master ``target`` (the current masters' order),
    with the partitions and command streams whose tags are among them (the trees' keys move with them)."""

    first: int
    last: int
    source: int
    target: int
    partitions: tuple[int, ...]
    streams: tuple[int, ...]

    def to_json(self) -> dict:
        return {"first": self.first, "last": self.last, "source": self.source, "target": self.target,
                "partitions": list(self.partitions), "command_streams": list(self.streams)}


def matched(p: SlotPlan, current: list[list[tuple[int, int]]]) -> list[int]:
    """Which current master takes each planned master's place: the one sharing the most slots with it
    (greedily, the largest overlaps first), so the fewest slots move."""
    if len(current) != len(p.masters):
        raise ValueError(f"the cluster has {len(current)} masters, the plan {len(p.masters)}")

    def overlap(a: tuple[tuple[int, int], ...] | list[tuple[int, int]], b: list[tuple[int, int]]) -> int:
        return sum(max(0, min(x[1], y[1]) - max(x[0], y[0]) + 1) for x in a for y in b)

    pairs = sorted(((overlap(m.ranges, ranges), -m.index, -c) for m in p.masters for c, ranges in enumerate(current)),
                   reverse=True)
    out: dict[int, int] = {}
    for _, planned, now in pairs:
        if -planned not in out and -now not in out.values():
            out[-planned] = -now
    return [out[m.index] for m in p.masters]


def aligned(p: SlotPlan, current: list[list[tuple[int, int]]]) -> SlotPlan:
    """The plan with each master numbered as the current master that takes its place (``matched``), so the
    plan's master k is the cluster's master k."""
    where = matched(p, current)
    return SlotPlan(p.partitions, p.streams, tuple(sorted(
        (MasterPlan(where[m.index], m.ranges, m.partitions, m.streams) for m in p.masters), key=lambda m: m.index)))


def moves(p: SlotPlan, current: list[list[tuple[int, int]]]) -> list[Move]:
    """What to move to bring a cluster whose masters own ``current`` (each master's ranges, in the cluster's
    order) to the plan, the planned masters matched to the current ones (``matched``)."""
    where = matched(p, current)
    now = [-1] * SLOTS
    for index, ranges in enumerate(current):
        for first, last in ranges:
            now[first:last + 1] = [index] * (last - first + 1)
    if -1 in now:
        raise ValueError(f"slot {now.index(-1)} has no master")
    then = [0] * SLOTS
    for m in p.masters:
        for first, last in m.ranges:
            then[first:last + 1] = [where[m.index]] * (last - first + 1)
    by_slot = {u.slot: u for u in tagged_slots(p.partitions, p.streams)}
    out, slot = [], 0
    while slot < SLOTS:
        if now[slot] == then[slot]:
            slot += 1
            continue
        end = slot
        while end + 1 < SLOTS and now[end + 1] == now[slot] and then[end + 1] == then[slot]:
            end += 1
        tagged = [by_slot[x] for x in range(slot, end + 1) if x in by_slot]
        out.append(Move(slot, end, now[slot], then[slot], tuple(sorted(x for u in tagged for x in u.partitions)),
                        tuple(sorted(x for u in tagged for x in u.streams))))
        slot = end + 1
    return out
