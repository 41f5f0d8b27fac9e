"""Which command streams a worker reads: each stream is one live worker's, the streams shared out evenly.

Workers that take turns at one stream's batches decide one sender's commands at once and conflict on its
record: on the benchmark machine two workers decided 0.8 times what one did, and four half
(BENCHMARKS.md). So each worker says it is alive in the members set
(``adapters/members.py``), and each shares the streams out the same way over the same live workers.

Ownership only spares work; correctness never rests on it. Every append checks the etags of the states
its decision read, so two workers that read one stream for a moment (one has not yet seen the other join
or leave) still decide correctly, with conflicts. The streams of a worker that died are read again once
it is ``worker_timeout_ms`` silent; the commands it held are reclaimed after ``reclaim_idle_ms``, as before.
"""

from collections.abc import Iterable

from treemail.adapters.members import Worker


def owned_streams(live: Iterable[Worker], me: Worker) -> frozenset[int]:
    """The command streams ``me`` reads. Each worker is (name, how many command streams it is configured
    with); stream i goes to the (i mod n)-th in name order of the n live workers configured with more than i
    streams. So every stream some worker is configured to read has exactly one reader, none is given to a
    worker that would not read it (a pool part-way through a change of ``command_streams``), and where all
    agree each reads streams // n of them or one more. ``me`` counts as live: a worker reads its share from
    its first heartbeat on, before it sees itself in the set."""
    members = sorted(set(live) | {me})
    owned = set()
    for index in range(me[1]):
        readers = [member for member in members if member[1] > index]
        if readers[index % len(readers)] == me:
            owned.add(index)
    return frozenset(owned)
