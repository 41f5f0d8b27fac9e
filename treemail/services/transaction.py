"""One write on one session: load, decide, plan, append; on a stale etag, all again on the newer state.

Every service that writes one session's stream under its etag goes through
``transact``: the session service's commands, a keyed tool call decided in
the host (a peer send, an interrupt, a peer admission), a notice appended
exactly once, a record of what happened elsewhere. The caller writes one
round (read, decide, plan: ``Write``); this module appends it and says what
the append's status means. The send round, which decides many sessions in
one batch, commits its own appends (``services.sends``).
"""

from collections.abc import Awaitable, Callable, Mapping
from typing import Any, NamedTuple

from ..adapters import metrics
from ..adapters.eventstore import EventStore, Loaded
from ..domain.commitplan import CommitPlan
from ..domain.errors import TreemailError
from . import contention


class Write(NamedTuple):
    """What one round decided: the plan appended on the state it was decided from, and the answer once it is.

    ``plan`` None: nothing to append, ``answer`` stands as it is. ``held``: the other sessions' states the
    decision read (their etags are checked in the same step)."""

    answer: Any
    plan: CommitPlan | None = None
    loaded: Loaded | None = None
    held: Mapping[str, Loaded] | None = None


class HandleTaken(TreemailError):
    """Another session of the tree holds this handle: registration draws another (never reaches a caller)."""

    code = "lifecycle:handle_taken"


# ``commit``'s answer when another writer appended first: the round is decided again on newer state.
CONFLICT = object()

Round = Callable[[int], Awaitable[Write]]
# The answer kept under the tool call's digest by an earlier append of the same call (a repeat's answer).
Replayed = Callable[[Any], Any]


async def commit(store: EventStore, write: Write, replayed: Replayed | None = None, counted: bool = False) -> Any:
    """One append of ``write``: its answer, the earlier answer (``replayed``) of a call kept already, or
    ``CONFLICT``. ``counted``: a conflict is counted as a command decided again (``treemail_conflict_retries``)."""
    if write.plan is None:
        return write.answer
    result = await store.append(store.prepare(write.plan, write.loaded, held=write.held))
    if result.status == "ok":
        return write.answer
    if result.status == "dup" and replayed is not None:
        return replayed(result.record)
    if result.status == "handle_taken":
        raise HandleTaken(write.plan.record.handle)
    if counted:
        metrics.CONFLICT_ROUNDS.inc()
    return CONFLICT


async def transact(store: EventStore, session_id: str, round_: Round, *, replayed: Replayed | None = None,
                   counted: bool = False, commit: Callable[..., Awaitable[Any]] = commit) -> Any:
    """Rounds of ``round_`` (given the round's number, from 0) until one's write applies; its answer.

    ``commit``: the one append of a round (a test's stand-in may drop its reply). Gives up with
    ``lifecycle:contention`` when the session keeps changing (``contention.rounds``)."""
    async for attempt in contention.rounds(session_id):
        answer = await commit(store, await round_(attempt), replayed, counted)
        if answer is not CONFLICT:
            return answer
