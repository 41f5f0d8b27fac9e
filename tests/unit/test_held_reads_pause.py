from treemail.adapters.eventstore import SendReads
from treemail.services import heldreads
from treemail.services.heldreads import HeldReads


def fresh_read() -> HeldReads:
    held = HeldReads(store=None)  # no session is asked for below: the store is never read
    held.remember(SendReads({}, {}, {}, False))
    return held


def test_held_states_are_paused_for_a_while_after_a_batch_that_mostly_conflicted():
    held = fresh_read()

    held.contended(conflicted=5, appended=10)

    assert held.paused  # the worker takes one batch at a time meanwhile
    assert [held.reads([], []) for _ in range(heldreads.PAUSE_BATCHES)] == [None] * heldreads.PAUSE_BATCHES
    assert not held.paused
    assert held.reads([], []) == SendReads({}, {}, {}, False)


def test_a_few_conflicts_do_not_pause_held_states():
    held = fresh_read()

    held.contended(conflicted=1, appended=100)

    assert not held.paused
    assert held.reads([], []) == SendReads({}, {}, {}, False)
