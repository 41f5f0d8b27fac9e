"""The commit script's arguments, by section: the one place that lays them out (``commit.lua`` reads them).

ARGV[1] is a header, the position where each section begins, in the order of ``Sections``' fields; the
script reads it once, at its top, into names. A section's length may vary (a count, then its items): no
position is derived by counting what came before, so a section added or grown cannot shift another's.
The last section holds the companions (other sessions of the partition the step appends to): their count,
one header per companion (where each of its ``CompanionSections`` begins), then their sections.
A test holds the script's names to these fields, in this order (``tests/unit/test_commit_args.py``).
"""

from collections.abc import Sequence
from typing import Any, NamedTuple


class CompanionSections(NamedTuple):
    """What the step writes on a companion's keys: as the session's own sections, one value or a count and
    its items each."""

    etags: tuple  # "expected new": the etag the step expects and the one it leaves
    snapshot: tuple
    session: tuple  # its session id
    feed_name: tuple  # its name in the feed (``compact.id_bytes``)
    events: tuple  # count, then (type, data) per event
    outbound: tuple  # count, then (field, value) pairs of the partition's outbound index
    mail: tuple  # count, then (message id, item or '' once done, where it is kept) per change
    wakes: tuple  # count, then one trigger each
    due: tuple  # the due index operation ('', 'set', 'lt', 'del') and its score


class Sections(NamedTuple):
    """The session's own sections, then its companions."""

    etags: tuple  # "expected new" ('' expected for a new session)
    snapshot: tuple
    record: tuple  # the idempotency record ('' none)
    record_field: tuple  # its field (``compact.record_field``)
    legacy_field: tuple  # the field an earlier version wrote the record under ('' none)
    registration: tuple  # '' none, '*' without a handle, else the handle to reserve
    session: tuple  # its session id
    feed_name: tuple  # its name in the feed (``compact.id_bytes``)
    events: tuple  # count, then (type, data) per event
    mail: tuple  # count, then (message id, item or '' to delete, 'due' | 'held' | 'new due' | 'new held')
    wakes: tuple  # count, then one trigger each
    approvals: tuple  # count, then (field, value) pairs of the partition's approvals hash
    grants: tuple  # count, then one tree grant label each
    feed_maxlen: tuple  # the feed's approximate max length
    due: tuple  # the due index operation ('', 'set', 'lt', 'del') and its score
    outbound: tuple  # count, then (field, value) pairs of its own records in the outbound index
    answer: tuple  # the answer to push ('' none), its list's lifetime, the command group, the entry to ack
    drain_read: tuple  # the drain flag the decision read: '1', '0', or '' if it read nothing of it
    protocol: tuple  # the protocol version every entry carries (`v`)
    companions: Sequence[CompanionSections]


def _header(starts: list[int]) -> str:
    return " ".join(map(str, starts))


def _extend(args: list[Any], sections: Sequence[tuple]) -> list[int]:
    """Appends each section to ``args``; returns the 1-based position (ARGV's) where each begins."""
    starts = []
    for section in sections:
        starts.append(len(args) + 1)
        args.extend(section)
    return starts


def lay_out(sections: Sections) -> list[Any]:
    """The script's ARGV for ``sections``: the header first, then the sections in the header's order."""
    args: list[Any] = [""]
    own = sections[:-1]
    starts = _extend(args, own)
    companions = sections.companions
    starts.append(len(args) + 1)
    args.append(len(companions))
    headers = len(args)
    args.extend([""] * len(companions))
    for n, companion in enumerate(companions):
        args[headers + n] = _header(_extend(args, companion))
    args[0] = _header(starts)
    return args
