"""The stream and group statistics (backlog, pending, live consumers, approvals waiting), polled every
``STATS_INTERVAL_S`` off the hot path while someone can read them (a metrics server)."""

import asyncio
from collections.abc import Callable

from treemail.adapters.config import ServiceConfig
from treemail.adapters.health import UNREACHABLE, OutageLog

from .periodic import PASS_DEADLINE_S, report_failure
from .stats import refresh_stats, server_unreachable

STATS_INTERVAL_S = 5.0


class StatsRefresh:
    def __init__(self, config: ServiceConfig, redis, stopping: Callable[[], bool], outages: OutageLog) -> None:
        self.config = config
        self.redis = redis
        self.stopping = stopping
        self.outages = outages

    async def refresh(self) -> None:
        await refresh_stats(self.redis, self.config)

    async def run(self) -> None:
        while not self.stopping():
            try:
                async with asyncio.timeout(PASS_DEADLINE_S):
                    await self.refresh()
                self.outages.ok("stats refresh")
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # noqa: BLE001 - observability must never stop a worker deciding
                if isinstance(exc, UNREACHABLE):
                    server_unreachable(self.config)
                report_failure(self.outages, "stats refresh", exc)
            await asyncio.sleep(STATS_INTERVAL_S)
