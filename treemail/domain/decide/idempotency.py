"""Idempotency: the one place that decides what a repeated tool call gets.

The key is the tool call (sender session, run, tool call id); its record
holds the fingerprint of the arguments and the outcome. The commit step only
refuses to write a second record for a key; what the caller is then answered
is decided here.
"""

import hashlib
import json

from ..commands import SendArguments, SendContext
from ..errors import Code

# Refusals that depend on the recipient's mutable state: recorded under the
# key, so a redelivered command is answered the same although room may have
# freed up since. Refusals that depend only on the arguments or on settings
# are not recorded; deciding them again gives the same answer anyway.
# Seed 002: the cutoff, drains and a parent's disposal are re-checked on every
# attempt, as the seed re-checks before each retry; a finished session could be
# run again by its host, so not_resumable is recorded.
RECORDED_REFUSALS = frozenset({Code.MAX_HOPS_EXCEEDED, Code.INBOX_FULL, Code.INFLIGHT_FULL, Code.NOT_RESUMABLE})


# Seed 002: refusals on state that moves on (a run ended, a drain, a disposal)
# and is not recorded. An earlier decision of the same tool call, made before
# the state moved, may have accepted it: the key's record is read first and,
# if there is one, it is the answer (a retried call returns its original outcome).
RECORD_FIRST = frozenset({
    Code.SENDER_NOT_LIVE, Code.DRAINING, Code.RECIPIENT_CLOSING, Code.SENDER_CLOSING, Code.PARENT_UNAVAILABLE,
})


def answers_from_record_first(code: Code) -> bool:
    return code in RECORD_FIRST


def key_digest(context: SendContext) -> str:
    raw = json.dumps([context.session_id, context.run_id, context.tool_call_id])
    return hashlib.sha256(raw.encode()).hexdigest()[:32]


def fingerprint(arguments: SendArguments) -> str:
    raw = json.dumps([arguments.to, arguments.body, arguments.mode])
    return hashlib.sha256(raw.encode()).hexdigest()[:32]


def is_recorded(code: Code) -> bool:
    return code in RECORDED_REFUSALS


def record(arguments: SendArguments, outcome: dict) -> dict:
    """What is kept under the key: enough to answer a retry and to spot a conflicting one."""
    return {"fp": fingerprint(arguments), "outcome": outcome}


CONFLICT_MESSAGE = (
    "this tool call was already sent with different arguments; make a new tool call to send another message"
)


def replayed_outcome(recorded: dict, arguments: SendArguments) -> dict:
    """The answer to a tool call whose key already has a record: the original outcome, or a conflict."""
    if recorded["fp"] != fingerprint(arguments):
        return {"error": {"code": Code.IDEMPOTENCY_CONFLICT.value, "message": CONFLICT_MESSAGE}}
    return recorded["outcome"]
