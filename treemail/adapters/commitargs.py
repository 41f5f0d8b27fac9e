"""The commit script's arguments, by section: the one place that lays them out (``commit.lua`` reads them).

ARGV[1] is a header, the position where each section begins, in the order of ``Sections``' fields; the
script reads it once, at its top, into one local per section. No position is derived by counting what came
before, so a section added or grown cannot shift another's. A section is one argument, or a list: a count,
then its items. The last section holds the companions (other sessions of the partition the step appends
to): their count, one header per companion (where each of its ``CompanionSections`` begins), then their
sections.
A test holds the script's names to these fields, in this order (``tests/unit/test_commit_args.py``).
"""

import struct
from collections.abc import Sequence
from typing import Any, NamedTuple


class CompanionSections(NamedTuple):
    """What the step writes on a companion's keys."""

    # One argument each:
    etags: str  # "expected new": the etag the step expects and the one it leaves
    snapshot: str
    session: str  # its session id
    feed_name: bytes  # its name in the feed (``compact.id_bytes``)
    due_op: str  # the due index operation: '', 'set', 'lt' or 'del'
    due_at: str  # its score ('' none)
    # Lists, a count first:
    events: tuple  # (type, data) per event
    outbound: tuple  # (field, value) pairs of the partition's outbound index
    mail: tuple  # (message id, item or '' once done, where it is kept) per change
    wakes: tuple  # one trigger each


class Sections(NamedTuple):
    """The session's own sections, then its companions."""

    # One argument each:
    etags: str  # "expected new" ('' expected for a new session)
    snapshot: str
    record: str  # the idempotency record ('' none)
    record_field: str | bytes  # its field (``compact.record_field``)
    legacy_field: str  # the field an earlier version wrote the record under ('' none)
    registration: str  # '' none, '*' without a handle, else the handle to reserve
    session: str  # its session id
    feed_name: bytes  # its name in the feed (``compact.id_bytes``)
    feed_maxlen: int  # the feed's approximate max length
    due_op: str  # the due index operation: '', 'set', 'lt' or 'del'
    due_at: str  # its score ('' none)
    answer: str  # the answer to push once applied ('' none)
    answer_ttl: int | str  # its reply list's lifetime
    command_group: str  # the group the command was read in
    entry_id: str | bytes  # the command's entry, acknowledged with the answer
    drain_read: str  # the drain flag the decision read: '1', '0', or '' if it read nothing of it
    protocol: int  # the protocol version every entry carries (`v`)
    # Lists, a count first:
    events: tuple  # (type, data) per event
    mail: tuple  # (message id, item or '' to delete, 'due' | 'held' | 'new due' | 'new held') per change
    wakes: tuple  # one trigger each
    approvals: tuple  # (field, value) pairs of the partition's approvals hash
    grants: tuple  # one tree grant label each
    outbound: tuple  # (field, value) pairs of its own records in the partition's outbound index
    # Last:
    companions: Sequence[CompanionSections]


# Where each kind's lists begin among its fields (the one-argument sections come first).
_OWN_LISTS = Sections._fields.index("events")
_COMPANION_LISTS = CompanionSections._fields.index("events")
# A header is the positions packed as 4-byte little-endian integers: the script unpacks them with ``struct``
# in one call. Formatting them as text took longer than laying out every other argument.
_OWN = struct.Struct(f"<{len(Sections._fields)}I")
_COMPANION = struct.Struct(f"<{len(CompanionSections._fields)}I")


def positions(header: bytes) -> tuple[int, ...]:
    """The positions a header holds, in its sections' order."""
    return struct.unpack(f"<{len(header) // 4}I", header)


def _append(args: list[Any], sections: tuple, lists_from: int) -> list[int]:
    """Appends ``sections`` to ``args``: one argument each, then from ``lists_from`` on a count and its items
    each. Returns where each begins (ARGV's positions, from 1), and last where the next would."""
    at = len(args) + 1
    starts = list(range(at, at + lists_from))
    args += sections[:lists_from]
    at += lists_from
    for items in sections[lists_from:]:
        starts.append(at)
        at += len(items)
        args += items
    starts.append(at)
    return starts


def lay_out(sections: Sections) -> list[Any]:
    """The script's ARGV for ``sections``: the header first, then the sections in the header's order."""
    args: list[Any] = [b""]
    companions = sections.companions
    starts = _append(args, sections[:-1], _OWN_LISTS)  # its last: where the companions' section begins
    args.append(len(companions))
    if companions:
        headers = len(args)
        args += [b""] * len(companions)
        for n, companion in enumerate(companions):
            args[headers + n] = _COMPANION.pack(*_append(args, companion, _COMPANION_LISTS)[:-1])
    args[0] = _OWN.pack(*starts)
    return args
