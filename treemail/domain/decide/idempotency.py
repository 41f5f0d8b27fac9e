"""Idempotency: the one place that decides what a repeated tool call gets.

The key is the tool call (sender session, run, tool call id); its record
holds the fingerprint of the arguments and the outcome. The record is kept
with the sender's session (one field of its idempotency hash, no expiry): a
retry gets the original outcome for as long as the session exists.

A tool call with a record is answered from it before any check runs
(``decide_send`` looks at it first): whatever changed since (messaging disabled, the inbox
filled, the sender's run finished, the rules changed) a retry returns what
the first call returned. The worker reads the record in the same round trip
as the states it decides on; the commit step refuses to write a second record
for a key, so a race between two deliveries of one command is answered the
same way.
"""

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .. import blocks, digests
from ..commands import SendArguments, SendContext
from ..errors import Code

# Refusals decided on the recipient's state (and, for source_capacity, the sender's): recorded in
# the same atomic step as the appends, against the etags, so a refusal decided on a state that has
# since changed is decided again rather than kept.
WITH_RECIPIENT = frozenset({Code.MAX_HOPS_EXCEEDED, Code.INBOX_FULL, Code.INFLIGHT_FULL, Code.SOURCE_CAPACITY,
                            Code.LOOP_DETECTED})
# Never recorded: a conflict says nothing about the first call; the others are
# answered by the producer, never decided by a worker. Exact live sender:
# sender_not_live says the context is stale or invented, nothing about the call:
# a record would keep a call from a run not yet opened refused for good, and let
# stale contexts grow the sender's records. (The refusals on drains, disposal,
# parents and resumability are recorded alone, like every other refusal a worker decides.)
NEVER = frozenset({Code.IDEMPOTENCY_CONFLICT, Code.ENGINE_SHUTDOWN, Code.INVALID_ARGUMENTS, Code.SENDER_NOT_LIVE,
                   Code.PEER_IDEMPOTENCY_CONFLICT, Code.PEER_ENGINE_SHUTDOWN, Code.PEER_INVALID_ARGUMENTS,
                   Code.INTERRUPT_IDEMPOTENCY_CONFLICT, Code.INTERRUPT_ENGINE_SHUTDOWN,
                   Code.INTERRUPT_INVALID_ARGUMENTS, Code.INTERRUPT_SENDER_NOT_LIVE})


def key_digest(context: SendContext) -> str:
    return digests.digest([context.session_id, context.run_id, context.tool_call_id])


def fingerprint(arguments: SendArguments) -> str:
    # The host's send options count only when given, so a plain send's fingerprint is what it always was.
    options = [] if arguments.expires_in_s is None and arguments.supersede_key is None else [
        "options", repr(arguments.expires_in_s), arguments.supersede_key or ""]
    # An urgent send is another send; a normal one keeps the fingerprint it always had.
    urgent = ["urgent"] if getattr(arguments, "urgent", False) else []
    return digests.digest([arguments.to, arguments.body, arguments.mode, *blocks.fingerprint_part(arguments.blocks),
                           *options, *urgent])


def answers_retries(code: Code) -> bool:
    """Whether a refusal is kept under its tool call, so that the same call again gets it back: every
    refusal but those that say nothing about the call (``NEVER``). One rule for every keyed tool: a peer
    send refused ``peer_message:outbox_full`` and retried once the capacity was full too is answered
    ``outbox_full`` again, not ``source_capacity``."""
    return code not in NEVER


def is_recorded(code: Code) -> bool:
    """Recorded with the recipient's append (checked against its etag)."""
    return code in WITH_RECIPIENT


def is_recorded_alone(code: Code) -> bool:
    """Recorded under the key by itself: every other refusal a worker decides, settings-dependent
    ones (disabled, the limits, the rules) included, so a retry cannot get a different answer."""
    return code not in WITH_RECIPIENT and code not in NEVER


# The answer to an accepted message, which most records keep: written as its three values (and its number in
# its pair, order and priority: four, read back as such).
_ACCEPTED = ("message_id", "mode", "recipient_state")
_NUMBERED = (*_ACCEPTED, "sequence")


def kept(fp: str, outcome: dict) -> list:
    """A record as stored (by every tool whose calls are keyed: send, peer send, interrupt): the
    fingerprint and the outcome, an accepted message's as ``[fp, message_id, mode, recipient_state]``.
    A record is kept per tool call for as long as its session, so it is kept short."""
    ok = outcome.get("ok")
    if isinstance(ok, dict) and tuple(ok) in (_ACCEPTED, _NUMBERED):
        return [fp, *ok.values()]
    return [fp, outcome]


def parse(recorded: list | dict) -> tuple[str | None, dict]:
    """The fingerprint and the outcome of a stored record; a record written before the short form is
    an object ``{"fp": ..., "outcome": ...}``."""
    if isinstance(recorded, dict):
        return recorded.get("fp"), recorded["outcome"]
    if len(recorded) == 1 + len(_ACCEPTED):
        return recorded[0], {"ok": dict(zip(_ACCEPTED, recorded[1:]))}
    if len(recorded) == 1 + len(_NUMBERED):
        return recorded[0], {"ok": dict(zip(_NUMBERED, recorded[1:]))}
    return recorded[0], recorded[1]


@dataclass(frozen=True)
class Keyed:
    """How one keyed tool's calls are recorded and replayed (send, peer send, interrupt): the fingerprint
    of its arguments, and the conflict a retry of the same call with other arguments is answered."""

    fingerprint: Callable[[Any], str]
    conflict: Code
    conflict_message: str

    def record(self, arguments, outcome: dict) -> list:
        """What is kept under the key: enough to answer a retry and to spot a conflicting one."""
        return kept(self.fingerprint(arguments), outcome)

    def replayed_outcome(self, recorded: list | dict, arguments) -> dict:
        """The answer to a tool call whose key already has a record: the original outcome, or a conflict."""
        fp, outcome = parse(recorded)
        if fp != self.fingerprint(arguments):
            return {"error": {"code": self.conflict.value, "message": self.conflict_message}}
        return outcome


CONFLICT_MESSAGE = (
    "this tool call was already sent with different arguments; make a new tool call to send another message"
)
SENDS = Keyed(fingerprint, Code.IDEMPOTENCY_CONFLICT, CONFLICT_MESSAGE)
record = SENDS.record
replayed_outcome = SENDS.replayed_outcome
