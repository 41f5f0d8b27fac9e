"""Causation and loop detection. Pure.

Every agent message names what caused it (``caused_by``: the last agent message
the sender's run consumed before sending, or none) and the causal chain it
belongs to (``chain_id``: its cause's chain; a message with no cause starts a
chain whose id is its own message id).

The loop rule, on bodies, cheap and bounded:

- a body's fingerprint is the set of its lower-cased word tokens within its
  first ``PREFIX_CHARS`` characters, each hashed to 16 bits (crc32) and only
  the ``SKETCH_SIZE`` smallest kept (a bottom-k sketch: exact for short
  bodies, an estimate for long ones; 64 hex characters in the snapshot);
- two bodies are near-duplicates when the Jaccard similarity of their
  fingerprints is at least ``SIMILAR_AT`` (0.8): "ok, thanks!" and "Thanks, OK."
  are; "round 2: 3310 rows" and "round 3: 4821 rows" are not;
- each recipient remembers, per sender, the chain and fingerprint of the last
  *answer* that sender sent it (a message caused by another: the one that
  starts a chain answers nothing) and its *repeat streak* (how many answers in
  a row, within one chain, were near-duplicates of the one before);
- a send from A to B is refused (``send_message:loop_detected``) when it would
  make A's streak to B reach ``STREAK_LIMIT`` (2) while B's latest message to
  A, in the same chain, already repeated itself (streak at least 1). A directed
  ping-pong with no new content is stopped at its third exchange (its fifth
  message, or its sixth when its first message started the chain and so is
  no answer), within the four exchanges allowed; either side saying something
  new resets its streak.

The memories live in the session state (the recipient's for the pair), at
most ``MAX_MARKS`` senders each (the least recent forgotten first), and are
folded from the accepted events. The state is written on every append: a
mark is about 150 bytes.
"""

import functools
import hashlib
import re
import uuid
import zlib
from typing import NamedTuple

PREFIX_CHARS = 2048
SKETCH_SIZE = 16
SIMILAR_AT = 0.8
STREAK_LIMIT = 2
# Senders remembered per recipient (the least recent dropped first), and chains noticed per ancestor.
MAX_MARKS = 16
MAX_NOTICED = 32
# The session state's run causes: runs whose last consumed message is remembered (their runs end; bounded anyway).
MAX_RUN_CAUSES = 16
# Delegation trees are shallow; this only bounds the walk up to a common ancestor over a corrupt directory.
MAX_DEPTH = 256

_TOKEN = re.compile(r"\w+")


class Mark(NamedTuple):
    """What a recipient remembers of the last message one sender sent it."""

    chain: str
    fingerprint: tuple[int, ...]
    streak: int

    def to_list(self) -> list:
        return [self.chain, "".join(f"{h:04x}" for h in self.fingerprint), self.streak]

    @classmethod
    def from_list(cls, fields) -> "Mark":
        printed = fields[1]
        return cls(fields[0], tuple(int(printed[i:i + 4], 16) for i in range(0, len(printed), 4)), fields[2])


def fingerprint(body: str) -> tuple[int, ...]:
    """The body's bottom-k sketch of word tokens hashed to 16 bits (sorted)."""
    return _sketch(body[:PREFIX_CHARS])


# One answer is fingerprinted by the decision, by the fold that decision's append makes and by every later fold
# of the recipient's state: the same text each time, computed once.
@functools.lru_cache(maxsize=1024)
def _sketch(prefix: str) -> tuple[int, ...]:
    tokens = set(_TOKEN.findall(prefix.lower()))
    return tuple(sorted({zlib.crc32(token.encode()) & 0xFFFF for token in tokens})[:SKETCH_SIZE])


def similarity(a: tuple[int, ...], b: tuple[int, ...]) -> float:
    """Jaccard similarity of two sketches, estimated over the smallest hashes of their union."""
    if not a and not b:
        return 1.0
    union = sorted(set(a) | set(b))[:SKETCH_SIZE]
    shared = set(a) & set(b)
    return sum(1 for h in union if h in shared) / len(union)


def similar(a: tuple[int, ...], b: tuple[int, ...]) -> bool:
    return similarity(a, b) >= SIMILAR_AT


def next_mark(previous: Mark | None, chain: str, body: str) -> Mark:
    """The sender's mark after one more message in ``chain`` with ``body``."""
    printed = fingerprint(body)
    if previous is not None and previous.chain == chain and similar(previous.fingerprint, printed):
        return Mark(chain, printed, previous.streak + 1)
    return Mark(chain, printed, 0)


def remembered(marks: dict[str, Mark], sender: str, mark: Mark) -> dict[str, Mark]:
    """``marks`` with ``sender``'s mark the most recent, the least recent dropped past ``MAX_MARKS``."""
    kept = {k: v for k, v in marks.items() if k != sender}
    kept[sender] = mark
    while len(kept) > MAX_MARKS:
        kept.pop(next(iter(kept)))
    return kept


def is_loop(sender_marks_at_recipient: Mark | None, recipient_marks_at_sender: Mark | None,
            chain: str, body: str) -> bool:
    """Whether sending ``body`` in ``chain`` continues a ping-pong with no new content.

    ``sender_marks_at_recipient``: the recipient's memory of the sender; ``recipient_marks_at_sender``: the
    sender's memory of the recipient (what came back)."""
    mine = next_mark(sender_marks_at_recipient, chain, body)
    theirs = recipient_marks_at_sender
    return mine.streak >= STREAK_LIMIT and theirs is not None and theirs.chain == chain and theirs.streak >= 1


def cause_of(run_causes: dict[str, tuple[str, ...]], run_id: str | None) -> tuple[str | None, str | None]:
    """(caused_by, chain_id) for a message the run sends: its last consumed agent message and that one's chain."""
    cause = run_causes.get(run_id) if run_id else None
    return (cause[0], cause[1]) if cause else (None, None)


def cause_trace(run_causes: dict[str, tuple[str, ...]], run_id: str | None) -> str | None:
    """The trace context a message the run sends continues: its cause's consume (None: no cause, or it was
    consumed with tracing off). So a conversation across sessions is one trace, as it is one chain."""
    cause = run_causes.get(run_id) if run_id else None
    return cause[2] if cause and len(cause) > 2 else None


def common_ancestor(sender_line: list[str], recipient_line: list[str]) -> str | None:
    """The nearest session both lines (a session, then its parent, ..., its root) share; None if none."""
    shared = set(sender_line)
    return next((session for session in recipient_line if session in shared), None)


def notice_id(chain: str, ancestor: str) -> str:
    """The notice's message id: one per chain and ancestor, the same however often it is decided."""
    digest = hashlib.sha256(f"loop\x00{chain}\x00{ancestor}".encode()).digest()
    return str(uuid.UUID(bytes=digest[:16], version=4))


def session_name(handle: str | None, session_id: str) -> str:
    """How a notice names a session: its handle (what agents address) and its id (what a debugger looks up,
    and what stays true after a handle is reused in another tree); the id alone for a session without one."""
    return f"{handle} (session {session_id})" if handle else f"session {session_id}"


def notice_text(sender: str, recipient: str, chain: str, body: str) -> str:
    excerpt = body if len(body) <= 400 else body[:399] + "…"
    return (
        f"treemail stopped a message loop: {sender} and {recipient} kept sending each other messages with no new "
        f"content (chain {chain}). Their next near-duplicate messages are refused with send_message:loop_detected "
        f"until one of them says something new. The refused message from {sender} to {recipient} was:\n\n{excerpt}"
    )


LOOP_MESSAGE = (
    "this message repeats what you and the recipient have already exchanged several times with no new content; "
    "it was not sent. Stop acknowledging; continue your task or send something new"
)
