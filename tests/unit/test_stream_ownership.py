"""How the command streams are shared out among the live workers (``consumers.ownership.owned_streams``)."""

import itertools

import pytest

from treemail.adapters import members
from treemail.consumers.ownership import owned_streams


@pytest.mark.parametrize("workers,streams", [(1, 4), (2, 4), (3, 4), (4, 4), (5, 4), (3, 16), (7, 1024)])
def test_every_stream_has_exactly_one_reader_and_shares_differ_by_at_most_one(workers, streams):
    live = [(f"host-{n}", streams) for n in range(workers)]
    shares = {me: owned_streams(live, me) for me in live}

    readers = [sum(index in share for share in shares.values()) for index in range(streams)]
    assert readers == [1] * streams
    sizes = [len(share) for share in shares.values()]
    assert max(sizes) - min(sizes) <= 1


def test_every_worker_shares_the_same_way_whatever_order_it_saw_the_others_in():
    live = [("w-c", 6), ("w-a", 6), ("w-b", 6)]
    for seen in itertools.permutations(live):
        assert owned_streams(seen, ("w-b", 6)) == owned_streams(live, ("w-b", 6))


def test_a_worker_that_does_not_see_itself_yet_counts_itself_live():
    assert owned_streams([], ("w-a", 3)) == frozenset({0, 1, 2})
    assert owned_streams([("w-b", 4)], ("w-a", 4)) == owned_streams([("w-a", 4), ("w-b", 4)], ("w-a", 4)) == {0, 2}


def test_a_worker_past_the_number_of_streams_reads_none():
    live = [("w-a", 2), ("w-b", 2), ("w-c", 2)]
    assert owned_streams(live, ("w-c", 2)) == frozenset()


def test_workers_configured_with_different_stream_counts_leave_no_stream_unread():
    # Part-way through a change of command_streams: a stream is never given to a worker that would not read it.
    live = [("new-1", 4), ("new-2", 4), ("old-1", 2), ("old-2", 2)]
    shares = {me: owned_streams(live, me) for me in live}

    assert [sum(index in share for share in shares.values()) for index in range(4)] == [1, 1, 1, 1]
    assert shares[("old-1", 2)] | shares[("old-2", 2)] <= {0, 1}


@pytest.mark.parametrize("name", ["host-123", "a name with spaces", "7 9"])
def test_a_members_set_entry_gives_back_its_worker(name):
    assert members.parse(members.entry((name, 16))) == (name, 16)
    assert members.parse(members.entry((name, 16)).encode()) == (name, 16)
