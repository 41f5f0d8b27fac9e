"""The commit plan: everything one decision writes, worked out from its events. Pure.

A decision's events go on one session's stream, and the records they imply
for their senders on each sender's stream, in one atomic step. Beside the
events that step writes what they leave: the snapshot, each pending-mail
item in the hash it belongs in, wake and interrupt triggers, the approvals
index, tree grants, the partition's due index (when the delivery pump must
next look at the session), each sender's outbound index entries, and the
tool call's idempotency record. All of it is computed here, once, from the
events and the states they were decided on; the event store only lays the
plan out as the commit script's arguments, and the script checks and writes.
"""

from collections.abc import Collection, Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

from . import events as ev
from .decide.delivery import next_check
from .decide.lifecycle import claimable
from .messaging import MessagingConfig
from .outbound import Source, index_entries
from .records import SessionRecord
from .state import Applied, MailItem, SessionState, WakeRequest, apply


@dataclass(frozen=True)
class Idempotency:
    """The tool call's record, kept under its digest with ``session_id`` (the caller's session, same slot)."""

    session_id: str
    digest: str
    record: list | dict


class MailChange(NamedTuple):
    """One pending-mail item the step writes, and where it is kept: 'due' while a claim may take it, else
    'held'; prefixed 'new ' for an item these events create, which neither hash holds yet; '' once done."""

    message_id: str
    item: MailItem | None
    where: str


class DueChange(NamedTuple):
    """The partition's due index: ('', None) unchanged, ('set', t) exactly t, ('lt', t) at most t, ('del', None)."""

    operation: str
    when: float | None


UNCHANGED = DueChange("", None)


@dataclass(frozen=True)
class SourceWrite:
    """What the step writes on another stream of the partition: a sender's records (the state they leave, its
    outbound entries), or a notice to a parent (its mail item, wake and due entry, as any accepted mail)."""

    record: SessionRecord
    events: list[ev.Event]
    state: SessionState
    # The partition's outbound index entries, a flat list: field, value, field, value ...
    outbound: list[str]
    # As ``CommitPlan``'s: the items, each wake requested, the due index change.
    mail: list[MailChange] = field(default_factory=list)
    wakes: list[WakeRequest] = field(default_factory=list)
    due: DueChange = UNCHANGED


@dataclass(frozen=True)
class CommitPlan:
    record: SessionRecord
    events: list[ev.Event]
    # The state, version, wakes, interrupts, approvals, grants and registration the events leave.
    applied: Applied
    mail: list[MailChange]
    due: DueChange
    sources: list[SourceWrite] = field(default_factory=list)
    idempotency: Idempotency | None = None
    # Whether the decision found the whole service draining (None: it did not look); the step applies only
    # if the partition's copy of the flag still says the same.
    read_draining: bool | None = None
    # The partition's outbound index entries (a flat field, value list) that the session's own events write (a peer
    # intent, and the receipt, refusal and settlement a peer driver records on its source).
    outbound: list[str] = field(default_factory=list)


def placement(item: MailItem, new: bool) -> str:
    """Where an item is kept: the due hash while a claim may take it, else the pending-mail hash."""
    where = "due" if claimable(item) else "held"
    return f"new {where}" if new else where


def due_change(applied: Applied, mail: dict[str, MailItem] | None, policy: MessagingConfig | None,
               now: float) -> DueChange:
    """The session's entry in the due index after ``applied``: exact when ``mail`` is all the pending
    mail the decision read, otherwise lowered to what the changed items need; unchanged without a policy."""
    if policy is None:
        return UNCHANGED
    if mail is not None:
        items = {**mail, **applied.mail_changes}
        when = next_check(applied.state, [i for i in items.values() if i is not None], policy, now)
        return DueChange("del", None) if when is None else DueChange("set", when)
    when = next_check(applied.state, [i for i in applied.mail_changes.values() if i is not None], policy, now)
    return UNCHANGED if when is None else DueChange("lt", when)


def source_write(source: Source, policy: MessagingConfig | None = None, now: float = 0.0) -> SourceWrite:
    """A sender's records change only its state; a notice written with them (a settlement notice, decided in
    the same step as the child's finish or disposal) is new mail there, kept like any other."""
    outbound = index_entries(source.record.session_id, source.events, source.version + 1)
    applied = apply(source.state, {}, source.events, source.version)
    if not applied.mail_changes and not applied.wakes:
        return SourceWrite(source.record, source.events, applied.state, outbound)
    mail = [MailChange(message_id, item, placement(item, True) if item else "")
            for message_id, item in applied.mail_changes.items()]
    return SourceWrite(source.record, source.events, applied.state, outbound, mail, applied.wakes,
                       due_change(applied, None, policy, now))


def plan_commit(
    record: SessionRecord,
    state: SessionState,
    version: int,
    events: list[ev.Event],
    *,
    mail: dict[str, MailItem] | None = None,
    mail_complete: bool = False,
    policy: MessagingConfig | None = None,
    now: float = 0.0,
    new_mail: Collection[str] = (),
    folded: SessionState | None = None,
    sources: Sequence[Source] = (),
    idempotency: Idempotency | None = None,
    read_draining: bool | None = None,
) -> CommitPlan:
    """The plan for appending ``events`` to ``record``'s stream after ``version`` (its state ``state``).

    ``mail``: the pending mail the decision read; ``mail_complete`` when it is all of it, not just the due
    hash or the one item a command named. ``policy`` keeps the due index, at ``now``. ``new_mail``: ids of
    messages these events accept for the first time. ``folded``: the state the events leave, when the
    decision folded them already (``state.apply``). ``sources``: the senders' records of the decision.
    """
    applied = apply(state, mail or {}, events, version, folded)
    changes = [MailChange(message_id, item, placement(item, message_id in new_mail) if item else "")
               for message_id, item in applied.mail_changes.items()]
    return CommitPlan(
        record, events, applied, changes, due_change(applied, mail if mail_complete else None, policy, now),
        [source_write(s, policy, now) for s in sources], idempotency, read_draining,
        index_entries(record.session_id, events, version + 1),
    )
