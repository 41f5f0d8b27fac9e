"""The cluster slot plan: every slot owned once, the partitions' and command streams' tags spread evenly."""

import pytest

from treemail.adapters import slotmoves, slotplan
from treemail.adapters.slotplan import SLOTS, partition_slot, plan, stream_slot

SHAPES = [(m, 16, 4) for m in range(1, 17)] + [
    (3, 1, 1), (5, 1, 1), (16, 1, 1), (2, 3, 7), (7, 64, 16), (3, 256, 32), (12, 30, 113), (30, 30, 113),
]


def owned(p) -> list[int]:
    slots = [0] * SLOTS
    for master in p.masters:
        for first, last in master.ranges:
            assert 0 <= first <= last < SLOTS
            for slot in range(first, last + 1):
                slots[slot] += 1
    return slots


def collide(partitions: int, streams: int) -> bool:
    tags = [partition_slot(p) for p in range(partitions)] + [stream_slot(c) for c in range(streams)]
    return len(set(tags)) < len(tags)


@pytest.mark.parametrize("masters,partitions,streams", SHAPES)
def test_every_slot_is_owned_by_exactly_one_master(masters, partitions, streams):
    assert owned(plan(masters, partitions, streams)) == [1] * SLOTS


@pytest.mark.parametrize("masters,partitions,streams", SHAPES)
def test_partitions_and_streams_within_one_of_an_even_share(masters, partitions, streams):
    assert not collide(partitions, streams)  # tags sharing a slot cannot be split: not these shapes
    p = plan(masters, partitions, streams)
    held_p = [len(m.partitions) for m in p.masters]
    held_s = [len(m.streams) for m in p.masters]
    assert sum(held_p) == partitions and sum(held_s) == streams
    assert max(held_p) - min(held_p) <= 1 and max(held_s) - min(held_s) <= 1
    assert min(held_p) == partitions // masters and min(held_s) == streams // masters
    # Where they are is where the tags' slots are.
    for m in p.masters:
        assert all(p.owner(partition_slot(x)) == m.index for x in m.partitions)
        assert all(p.owner(stream_slot(x)) == m.index for x in m.streams)


@pytest.mark.parametrize("masters,partitions,streams", SHAPES)
def test_a_master_with_one_more_partition_holds_no_more_streams(masters, partitions, streams):
    p = plan(masters, partitions, streams)
    if partitions % masters + streams % masters > masters:
        pytest.skip("more extras than masters: some master must hold both")
    for a in p.masters:
        for b in p.masters:
            if len(a.partitions) > len(b.partitions):
                assert len(a.streams) <= len(b.streams)


@pytest.mark.parametrize("masters,partitions,streams", SHAPES)
def test_the_other_slots_fill_out_an_even_share_each(masters, partitions, streams):
    slots = [m.slots for m in plan(masters, partitions, streams).masters]
    assert sum(slots) == SLOTS
    assert max(slots) - min(slots) <= 1


def test_the_plan_is_deterministic():
    assert plan(3, 16, 4) == plan(3, 16, 4)
    assert plan(7, 64, 16).to_json() == plan(7, 64, 16).to_json()


def test_three_masters_for_the_default_service():
    """16 partitions, 4 command streams: 6 / 5 / 5 and 1 / 1 / 2, the extra stream on a master without an
    extra partition, in a few ranges (an even split holds 4 / 5 / 7 and 1 / 2 / 1 in three)."""
    p = plan(3, 16, 4)
    assert sorted((len(m.partitions), len(m.streams)) for m in p.masters) == [(5, 1), (5, 2), (6, 1)]
    assert sum(len(m.ranges) for m in p.masters) <= 8
    even = slotmoves.even_split(3)
    assert sorted(sum(1 for x in range(16) if a <= partition_slot(x) <= b) for a, b in even) == [4, 5, 7]


def test_one_master_owns_everything_in_one_range():
    (only,) = plan(1, 16, 4).masters
    assert only.ranges == ((0, SLOTS - 1),)


def test_tags_sharing_a_slot_stay_together():
    """Thousands of partitions: some tags hash to one slot; they go to one master, every slot still once."""
    p = plan(4, 4096, 64)
    assert owned(p) == [1] * SLOTS
    assert sum(len(m.partitions) for m in p.masters) == 4096


def test_service_keys_are_named_with_their_master():
    p = plan(3, 16, 4)
    rows = p.service_keys()
    assert {r["key"] for r in rows} == {"tm:drain", "tm:workers", "tm:projectors", "tm:cmd:dead"}
    for row in rows:
        ranges = p.masters[row["master"]].ranges
        assert any(a <= row["slot"] <= b for a, b in ranges)


def test_even_split_is_what_a_cluster_create_makes():
    assert slotmoves.even_split(3) == [(0, 5460), (5461, 10922), (10923, 16383)]
    assert slotmoves.even_split(1) == [(0, 16383)]
    assert slotmoves.even_split(16)[1] == (1024, 2047)


@pytest.mark.parametrize("masters", [0, -1, slotplan.MAX_MASTERS + 1])
def test_a_bad_number_of_masters_is_refused(masters):
    with pytest.raises(ValueError, match="masters must be between 1 and"):
        plan(masters, 16, 4)


@pytest.mark.parametrize("masters", [2, 3, 5, 16])
def test_the_moves_bring_an_even_split_to_the_plan(masters):
    p = plan(masters, 16, 4)
    current = [[r] for r in slotmoves.even_split(masters)]
    where = slotmoves.matched(p, current)
    assert sorted(where) == list(range(masters))
    owner = [0] * SLOTS
    for index, ranges in enumerate(current):
        for first, last in ranges:
            owner[first:last + 1] = [index] * (last - first + 1)
    moved = slotmoves.moves(p, current)
    for move in moved:
        assert all(owner[s] == move.source for s in range(move.first, move.last + 1))
        owner[move.first:move.last + 1] = [move.target] * (move.last - move.first + 1)
        assert all(move.first <= partition_slot(x) <= move.last for x in move.partitions)
    for m in p.masters:
        assert all(owner[s] == where[m.index] for first, last in m.ranges for s in range(first, last + 1))
    # What moves with the tagged slots is what changes masters: the partitions an even split misplaces.
    misplaced = {x for x in range(16) if owner_of(current, partition_slot(x)) != where[p.owner(partition_slot(x))]}
    assert {x for move in moved for x in move.partitions} == misplaced


def owner_of(current, slot: int) -> int:
    return next(i for i, ranges in enumerate(current) for a, b in ranges if a <= slot <= b)


def test_a_cluster_placed_by_the_plan_needs_no_moves():
    p = plan(3, 16, 4)
    assert slotmoves.moves(p, [list(m.ranges) for m in p.masters]) == []
    with pytest.raises(ValueError, match="the cluster has 2 masters, the plan 3"):
        slotmoves.moves(p, [[(0, 8191)], [(8192, 16383)]])


def test_masters_beyond_the_tags_still_own_an_even_share_each():
    p = plan(1000, 16, 4)
    assert owned(p) == [1] * SLOTS
    assert {m.slots for m in p.masters} == {16, 17}
    assert sum(1 for m in p.masters if m.partitions or m.streams) == 20


def test_an_aligned_plan_numbers_each_master_as_the_cluster_does():
    current = [[r] for r in slotmoves.even_split(3)]
    p = plan(3, 16, 4)
    a = slotmoves.aligned(p, current)
    assert slotmoves.matched(a, current) == [0, 1, 2]
    assert {m.ranges for m in a.masters} == {m.ranges for m in p.masters}
    assert slotmoves.moves(a, current) == slotmoves.moves(p, current)
    assert owned(a) == [1] * SLOTS
