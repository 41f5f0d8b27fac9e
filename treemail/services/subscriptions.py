"""Every session's mail events, live and resumable from a position (``adapters.observe`` reads the feeds)."""

from collections.abc import Callable, Collection

from ..adapters import observe
from ..adapters.config import ServiceConfig
from ..adapters.observe import MAIL_EVENTS, Observed, SubscriptionGap
from ..domain import events as ev

__all__ = ["Subscriptions", "MAIL_EVENTS", "Observed", "SubscriptionGap"]


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
        return observe.subscribe(self._redis, self._config, after, types, self._closing, block_ms)
