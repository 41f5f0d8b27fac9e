"""Order and priority: the order a claim delivers its due mail in, and a pair's read receipt. Pure.

Every claim path calls ``claim_order`` on what it found due, so a filter of
another rule (what is due at all) composes with it: filter first, then order.

- Per-pair order. Each agent message carries ``pair_seq``, its number in its
  directed pair (sender -> recipient), given where it lands on the
  recipient's stream (so numbers follow the stream, gap-free). A claim never
  hands out a pair's message while an earlier one of the same pair still
  waits out a failed attempt's backoff: it is held back with it, so the
  recipient reads a pair in sending order even across retries.
- Priority. Urgent mail comes before normal mail, each in stream order, but a
  normal message is never passed by more than ``bound`` urgent messages sent
  after it (the starvation bound): once the oldest waiting normal message
  has been passed ``bound`` times, it goes next.
"""

from collections.abc import Iterable, Mapping

from ..state import MailItem, SessionState


def held_back(candidates: Iterable[MailItem], now: float) -> list[MailItem]:
    """``candidates`` (due in this claim but for their backoff) without the ones that must wait: those still
    backing off, and every later message of a pair one of whose earlier messages is still backing off (a
    pair's numbers follow stream positions, so "later" is a later position from the same sender)."""
    candidates = list(candidates)
    blocked: dict[str, int] = {}  # sender -> the earliest position of its mail still backing off
    for item in candidates:
        if item.retry_at > now and item.sender_session_id is not None:
            sender = item.sender_session_id
            blocked[sender] = min(blocked.get(sender, item.seq), item.seq)
    return [
        item for item in candidates
        if item.retry_at <= now and not (
            item.sender_session_id in blocked and item.seq > blocked[item.sender_session_id]
        )
    ]


def any_due(items: Iterable[MailItem], now: float, waiting: tuple[str, ...]) -> bool:
    """Whether any of ``items`` may be taken at ``now``: waiting (a state in ``waiting``), past its backoff, and
    not held behind an earlier message of its pair still backing off (that one's backoff end is the time to
    look again), so a session is not woken for mail its run could not take."""
    return any(m.state in waiting for m in held_back([m for m in items if m.state in waiting], now))


def held_by_pair(items: Iterable[MailItem], now: float) -> set[str]:
    """The message ids ``held_back`` keeps waiting for an earlier message of their pair alone (their own
    backoff is over): a run that ends without them did not fail them."""
    items = list(items)
    waiting = {m.message_id for m in items if m.retry_at <= now}
    return waiting - {m.message_id for m in held_back(items, now)}


def claim_order(due: Iterable[MailItem], bound: int) -> list[MailItem]:
    """The order a claim hands ``due`` out in: by (priority, stream position), normal mail passed by at most
    ``bound`` urgent messages sent after it."""
    items = sorted(due, key=lambda m: m.seq)
    urgent = [m for m in items if m.urgent]
    normal = [m for m in items if not m.urgent]
    ordered: list[MailItem] = []
    passes = 0  # urgent messages sent after the oldest waiting normal one, handed out before it
    u = n = 0
    while u < len(urgent) or n < len(normal):
        if u < len(urgent) and (n == len(normal) or urgent[u].seq < normal[n].seq or passes < bound):
            if n < len(normal) and urgent[u].seq > normal[n].seq:
                passes += 1
            ordered.append(urgent[u])
            u += 1
        else:
            ordered.append(normal[n])
            n += 1
            # The next normal message was passed by every urgent one sent after it, no more than its elder.
            passes = sum(1 for m in ordered if m.urgent and n < len(normal) and m.seq > normal[n].seq)
    return ordered


def next_number(state: SessionState, sender_session_id: str) -> int:
    """The number the next message of this pair gets on the recipient ``state`` is folded for."""
    return sent_through(state, sender_session_id) + 1


def sent_through(state: SessionState, sender_session_id: str) -> int:
    """The number of the last message ``sender_session_id`` landed on this session (0: none). A counter set
    aside (its sender had nothing pending) reads as the floor: no number of that pair up to it is pending."""
    return state.pair_seq.get(sender_session_id, state.pair_seq_floor)


def pending_from(mail: Mapping[str, MailItem], sender_session_id: str) -> list[int]:
    """The stream positions of the pair's pending messages (their accepted events carry their numbers)."""
    return sorted(m.seq for m in mail.values() if m.sender_session_id == sender_session_id)


def consumed_through(state: SessionState, pending_numbers: Iterable[int | None], sender_session_id: str) -> int:
    """The pair's read receipt: the highest N such that every message numbered up to N from
    ``sender_session_id`` is done here (consumed, or discarded: it will never be read, so it does not hold
    the receipt back forever). Numbers are given in stream order, so it is one below the lowest one still
    pending (``pending_numbers``: the numbers of the pair's pending messages; None for one sent unnumbered)."""
    numbered = [n for n in pending_numbers if n is not None]
    return min(numbered) - 1 if numbered else sent_through(state, sender_session_id)
