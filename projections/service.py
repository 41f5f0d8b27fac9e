"""The projection worker process: `treemail projections`.

Follows the partition feeds with a ``ProjectionRunner`` and keeps going
through outages: a failed step is logged once per change of state, and the
runner is rebuilt from the stored views and checkpoints when the server is
back (a step that failed half way may have folded in memory what it never
wrote, so its in-memory state is not trusted). ``/readyz`` answers while the
server answers and the runner has caught up at start; ``/healthz`` while the
loop ticks.
"""

import asyncio
import logging
import signal
import time

from treemail.adapters import metrics
from treemail.adapters.config import Config
from treemail.adapters.connection import connect
from treemail.adapters.eventstore import EventStore
from treemail.adapters.health import UNREACHABLE, Health, OutageLog, watch

from .runner import ProjectionRunner
from .views import PROJECTIONS

log = logging.getLogger("treemail.projections")

REPORT_EVERY_S = 5.0
RETRY_AFTER_S = 0.5


class ProjectionService:
    def __init__(self, config: Config, redis) -> None:
        self.config = config
        self.redis = redis
        self.health = Health()
        self.outages = OutageLog(log)
        self.runner: ProjectionRunner | None = None
        self.stopping = asyncio.Event()

    async def probe(self) -> str | None:
        await self.redis.ping()
        return None if self.runner is not None else "catching up with the feeds"

    async def _step(self, reported: float) -> float:
        if self.runner is None:
            runner = ProjectionRunner(EventStore(self.redis, self.config.service), self.config)
            await runner.start()
            self.runner = runner
        await self.runner.step()
        if time.monotonic() - reported > REPORT_EVERY_S:
            self.runner.report_views()
            reported = time.monotonic()
        return reported

    async def run(self) -> None:
        metrics.known_projections(list(PROJECTIONS))
        reported = 0.0
        while not self.stopping.is_set():
            try:
                reported = await self._step(reported)
                self.outages.ok("projection step")
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # noqa: BLE001 - retried; the stored views are the truth
                self.runner = None
                self.outages.failed("server" if isinstance(exc, UNREACHABLE) else "projection step", exc)
                try:
                    await asyncio.wait_for(self.stopping.wait(), RETRY_AFTER_S)
                except asyncio.TimeoutError:
                    pass


async def serve(config: Config, url: str, metrics_port: int | None = None) -> None:
    redis = await connect(url, config.service)
    service = ProjectionService(config, redis)
    server = None
    if metrics_port is not None and metrics_port >= 0:
        server = metrics.start_server(metrics_port, "projection", metrics.PROJECTION_REGISTRY, service.health)
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, service.stopping.set)
    watcher = asyncio.create_task(watch(service.health, service.probe, service.outages, service.stopping.is_set))
    try:
        await service.run()
    finally:
        service.health.set(False, "stopping")
        watcher.cancel()
        await asyncio.gather(watcher, return_exceptions=True)
        if server is not None:
            await asyncio.to_thread(metrics.stop_server, server)
        await redis.aclose()
