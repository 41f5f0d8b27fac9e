"""A keyed tool call decided in the host process (a peer send, an interrupt, a peer admission): its writes.

The decision is committed on the target's stream with the tool call's
idempotency record, in the same atomic step and under the same expected etag
as any append (``transaction``). The step answers one of three ways: applied
(the decision's outcome stands), the call was decided already (its first
outcome is the answer, or a conflict if its arguments differ), or another
writer came first (the caller decides again on fresh state, counted).
"""

from collections.abc import Awaitable, Callable
from typing import Any

from ..adapters.eventstore import EventStore, Loaded
from ..domain.commitplan import Idempotency, plan_commit
from ..domain.decide.idempotency import Keyed
from ..domain.decide.send import Accepted, Refused, outcome_of
from ..domain.messaging import MessagingConfig
from ..domain.records import SessionRecord
from . import transaction
from .transaction import Round, Write


def keyed_write(
    keyed: Keyed, arguments, digest: str, target: SessionRecord, loaded: Loaded, decision: Accepted | Refused, *,
    policy: MessagingConfig | None = None, now: float = 0.0, read_draining: bool | None = None,
) -> Write:
    """The write that makes the outcome the model is answered durable, kept under ``digest`` on ``target``.

    ``policy`` keeps the partition's due index at ``now``; ``read_draining``: the service-wide drain flag
    as the decision read it (None: it did not look)."""
    outcome = outcome_of(decision)
    events = decision.events if isinstance(decision, Accepted) else []
    plan = plan_commit(
        target, loaded.state, loaded.version, events, policy=policy, now=now, read_draining=read_draining,
        idempotency=Idempotency(target.session_id, digest, keyed.record(arguments, outcome)),
    )
    return Write(outcome, plan, loaded)


async def transact_keyed(store: EventStore, session_id: str, keyed: Keyed, arguments, round_: Round, *,
                         commit: Callable[..., Awaitable[Any]] = transaction.commit) -> dict:
    """``transaction.transact`` for a keyed call: a repeat is answered with the call's first outcome."""
    return await transaction.transact(
        store, session_id, round_, replayed=lambda kept: keyed.replayed_outcome(kept, arguments), counted=True,
        commit=commit,
    )
