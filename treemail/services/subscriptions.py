"""Every session's mail events, live and resumable from a position (``adapters.observe`` reads the feeds)."""

from collections.abc import Callable, Collection

from ..adapters import observe
from ..adapters.config import ServiceConfig
from ..adapters.observe import MAIL_EVENTS, Observed, SubscriptionGap
from ..domain import events as ev
from ..domain import limits

__all__ = ["Subscriptions", "MAIL_EVENTS", "Observed", "SubscriptionGap"]


def require_subscription(after, types, block_ms) -> None:
    """A subscription as the feeds can take it, refused when it is asked for, not at its first read: a position
    as text, event classes, and a wait in whole milliseconds (none would read the feeds without pause)."""
    if after is not None and not isinstance(after, str):
        raise limits.invalid('after must be None, "start" or a position a subscription yielded')
    if types is not None and (isinstance(types, (str, bytes)) or not isinstance(types, Collection) or not all(
            isinstance(t, type) and issubclass(t, ev.Event) for t in types)):
        raise limits.invalid("types must be a collection of event classes, or None for every type")
    if isinstance(block_ms, bool) or not isinstance(block_ms, int) or block_ms < 1:
        raise limits.invalid(f"block_ms must be a whole number of milliseconds, 1 or more, got {limits.shown(block_ms)}")


class Subscriptions:
    def __init__(self, redis, config: ServiceConfig, closing: Callable[[], bool]) -> None:
        """``closing``: whether the host is closing (a live subscription ends then)."""
        self._redis = redis
        self._config = config
        self._closing = closing

    async def position(self) -> str:
        """Where every feed ends now: a subscription after it misses nothing appended later."""
        return str(await observe.starting_position(self._redis, self._config.partitions, None))

    def subscribe(self, after: str | None, types: Collection[type[ev.Event]] | None, block_ms: int):
        require_subscription(after, types, block_ms)
        return observe.subscribe(self._redis, self._config, after, types, self._closing, block_ms)
