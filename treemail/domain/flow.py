"""Typed backpressure: how long a refused send should wait, from what was seen to drain. Pure.

A refusal that may pass later (a full inbox, a full pair window, a source's
capacity, a full peer outbox, a drain) carries ``retry_after_ms`` and the
occupancy that caused it. The wait is not a constant: each session folds a
pace from its own stream (the timestamps of the mail it consumed, and of the
settlements its sends received), and the wait is the number of slots that must
free up times the seconds per slot it was seen to take, bounded by the
configuration; a fallback when nothing was seen yet.
"""

from typing import NamedTuple

from .messaging import MessagingConfig

# A pace sample is taken once a window holds this much time: a claim's batch consumed within a
# few milliseconds then counts as the batch it is, not as a rate of thousands a second.
WINDOW_S = 1.0
# A gap this long is idleness, not pace: the window starts again after it.
IDLE_S = 300.0
# How much a new sample moves the estimate: recent pace matters, one odd window does not decide it.
WEIGHT = 0.5


class Pace(NamedTuple):
    """Seconds per drained slot, folded from drain timestamps; all zero: nothing observed."""

    start: float = 0.0  # the open window's start (the drain that opened it)
    count: int = 0  # drains since ``start``
    last: float = 0.0  # the latest drain
    interval: float = 0.0  # the estimate from closed windows (0: none closed yet)

    @classmethod
    def of(cls, value) -> "Pace":
        """From its snapshot form (a list), or a default for a snapshot older than the field."""
        return cls(*value) if value else NOTHING


NOTHING = Pace()


def observe(pace: Pace, at: float) -> Pace:
    """One more drain at ``at`` (an event's own timestamp: the fold stays pure and replays the same)."""
    if pace.start <= 0 or at - pace.last > IDLE_S or at < pace.last:
        return Pace(at, 0, at, pace.interval)
    count = pace.count + 1
    if at - pace.start < WINDOW_S:
        return Pace(pace.start, count, at, pace.interval)
    sample = (at - pace.start) / count
    interval = sample if pace.interval <= 0 else pace.interval + WEIGHT * (sample - pace.interval)
    return Pace(at, 0, at, interval)


def seconds_per_slot(pace: Pace) -> float | None:
    """The estimate; an open window with drains in it stands in before any window closed."""
    if pace.interval > 0:
        return pace.interval
    if pace.count > 0 and pace.last > pace.start:
        return (pace.last - pace.start) / pace.count
    return None


def retry_after_ms(pace: Pace, needed: int, config: MessagingConfig) -> int:
    """Milliseconds until ``needed`` slots are expected to free up, within the configured bounds."""
    per_slot = seconds_per_slot(pace)
    wanted = config.retry_after_fallback_ms if per_slot is None else max(1, needed) * per_slot * 1000
    return int(round(min(config.retry_after_max_ms, max(config.retry_after_min_ms, wanted))))


def backpressure(retry_ms: int, occupancy: dict) -> dict:
    """What a refusal carries besides its code and message (structured result, idempotency record)."""
    return {"retry_after_ms": retry_ms, "occupancy": occupancy}


def seconds(retry_ms: int) -> str:
    return f"{retry_ms / 1000:.1f} s"


def appended(message: str, retry_ms: int, occupancy_text: str) -> str:
    """The default text as it is, then when to retry and why: ``…; try again later (retry after 1.2 s: 32 of 32
    pending)``."""
    return f"{message} (retry after {seconds(retry_ms)}: {occupancy_text})"
