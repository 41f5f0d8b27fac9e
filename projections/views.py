"""The read models and how each event changes them. Pure.

A view is a flat mapping of field -> value, stored as one Redis hash per
partition. Every view also remembers, per session, the position of the last
event it folded (``seq:<session>``): folding is then idempotent, so a live
runner may start from a feed position that a rebuild already covered and the
result is the same.

Adding a projection: an ``apply`` function here and one ``Projection`` row in
PROJECTIONS naming the event types it reads. Its first runner finds no
checkpoint and rebuilds it from the beginning of history.
"""

from collections.abc import Callable, Iterable
from dataclasses import dataclass

from treemail.adapters.viewstore import View
from treemail.domain import events as ev
Apply = Callable[[View, str, ev.Event], None]


def _add(view: View, field: str, delta: int) -> None:
    value = int(view.get(field, 0)) + delta
    if value > 0:
        view[field] = str(value)
    else:
        view.pop(field, None)


# How one message event changes the mail still pending: accepted, or restored (consumed on a reverted
# branch), +1; consumed or discarded, -1. A lookup by exact type: the folds hand ``apply`` only the types a
# projection reads, and this is what the three mail projections read, once.
_PENDING: dict[type, int] = {ev.ProducerMessageAccepted: 1, ev.ProducerMessageRestored: 1,
                             ev.ProducerMessageConsumed: -1, ev.ProducerMessageDiscarded: -1}


def inbox(view: View, session_id: str, event: ev.Event) -> None:
    """Pending agent mail per recipient session."""
    delta = _PENDING.get(type(event))
    if delta and event.owner == "agent":
        _add(view, session_id, delta)


def pairs(view: View, session_id: str, event: ev.Event) -> None:
    """Unacknowledged agent mail per directed pair, ``sender>recipient``."""
    delta = _PENDING.get(type(event))
    if delta and event.owner == "agent":
        _add(view, f"{event.sender_session_id}>{session_id}", delta)


def wakes(view: View, session_id: str, event: ev.Event) -> None:
    """Sessions with a wake requested and no run started since: what host runners still owe.

    A session past its disposal cutoff starts no run again: it is owed nothing.
    """
    match event:
        case ev.SessionWakeRequested():
            view[session_id] = event.message_id or "-"
        case ev.SessionRunStarted() | ev.SessionClosing():
            view.pop(session_id, None)


def trees(view: View, session_id: str, event: ev.Event) -> None:
    """Per delegation tree: sessions, pending mail of every owner, mail accepted and done."""
    if type(event) is ev.SessionRegistered:
        root = event.root_session_id
        view[f"root:{session_id}"] = root
        _add(view, f"{root}:sessions", 1)
        return
    delta = _PENDING.get(type(event))
    if not delta:
        return
    root = view.get(f"root:{session_id}")
    if root is None:
        return
    if type(event) is ev.ProducerMessageAccepted:
        _add(view, f"{root}:accepted", 1)
    else:
        # Done when consumed or discarded; restored (consumed on a reverted branch): not done after all.
        _add(view, f"{root}:done", -delta)
    _add(view, f"{root}:pending", delta)


@dataclass(frozen=True)
class Projection:
    """A read model: its name, the event types it reads, and how one of them changes it. Declared once."""

    name: str
    reads: frozenset[type]
    apply: Apply


_MAIL_DONE = tuple(_PENDING)

# The one registry: the live runner folds through ``fold_event``, the rebuild through ``fold_stream``; both
# call ``apply`` only for the types in ``reads``, so the two can never see different events.
PROJECTIONS: dict[str, Projection] = {
    p.name: p
    for p in (
        Projection("inbox", frozenset(_MAIL_DONE), inbox),
        Projection("pairs", frozenset(_MAIL_DONE), pairs),
        Projection("wakes", frozenset((ev.SessionWakeRequested, ev.SessionRunStarted, ev.SessionClosing)), wakes),
        Projection("trees", frozenset((ev.SessionRegistered, *_MAIL_DONE)), trees),
    )
}


def fold_event(view: View, projection: Projection, session_id: str, seq: int, event: ev.Event | None) -> bool:
    """Fold one event unless the view already holds it; returns whether it was new."""
    marker = f"seq:{session_id}"
    if int(view.get(marker, 0)) >= seq:
        return False
    view[marker] = str(seq)
    if type(event) in projection.reads:
        projection.apply(view, session_id, event)
    return True


def fold_stream(
    views: list[tuple[View, Projection]], session_id: str, events: Iterable[tuple[int, ev.Event | None]]
) -> None:
    """``fold_event`` over consecutive events of one session, for several views in one pass over the
    events, each view's position written once.

    ``events`` may be a generator: each event is folded into every view and dropped before the next is
    decoded, so a rebuild never holds a chunk of decoded events (thousands of surviving objects would
    make the garbage collector walk them again and again).
    """
    marker = f"seq:{session_id}"
    done = [int(view.get(marker, 0)) for view, _ in views]
    # Which views read which type, so an event costs one lookup, not a test per projection.
    readers: dict[type, list[tuple[int, View, Apply]]] = {}
    for (view, projection), position in zip(views, done):
        for cls in projection.reads:
            readers.setdefault(cls, []).append((position, view, projection.apply))
    last = 0
    for seq, event in events:
        last = seq
        for position, view, apply in readers.get(type(event), ()):
            if seq > position:
                apply(view, session_id, event)
    for (view, _), position in zip(views, done):
        if last > position:
            view[marker] = str(last)


def tree_summaries(view: View) -> dict[str, dict[str, int]]:
    out: dict[str, dict[str, int]] = {}
    for field, value in view.items():
        if field.startswith(("root:", "seq:")):
            continue
        root, metric = field.rsplit(":", 1)
        out.setdefault(root, {"sessions": 0, "pending": 0, "accepted": 0, "done": 0})[metric] = int(value)
    return out
