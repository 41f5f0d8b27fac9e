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
import contextlib
import logging
import os
import socket
import time

from tenacity import AsyncRetrying, RetryCallState, retry_if_exception_type, wait_fixed

from treemail.adapters import keys, members, metrics
from treemail.adapters.config import Config
from treemail.adapters.connection import connect
from treemail.adapters.health import UNREACHABLE, Health, OutageLog
from treemail.adapters.lifecycle import serve_until_signalled
from treemail.services import bootstrap

from .runner import ProjectionRunner
from .views import PROJECTIONS

log = logging.getLogger("treemail.projections")

REPORT_EVERY_S = 5.0
# A running projection worker says so this often in ``keys.projection_members``; `replay` takes one silent
# for PRESENCE_MS as stopped. It keeps its own views and checkpoints until its next write finds a rebuild's
# (then it folds on from those), hence the warning.
PRESENCE_EVERY_S = 1.0
PRESENCE_MS = 5_000
RETRY_AFTER_S = 0.5


class ProjectionService:
    def __init__(self, config: Config, redis) -> None:
        self.config = config
        self.redis = redis
        self.health = Health()
        self.outages = OutageLog(log)
        self.runner: ProjectionRunner | None = None
        self.stopping = asyncio.Event()
        self._reported = 0.0
        self._announced = 0.0
        self.name = f"{socket.gethostname()}-{os.getpid()}"

    async def probe(self) -> str | None:
        await self.redis.ping()
        return None if self.runner is not None else "catching up with the feeds"

    async def _step(self) -> None:
        if self.stopping.is_set():
            return  # stopped during the pause after a failure
        if self.runner is None:
            runner = ProjectionRunner(bootstrap.projections(self.redis, self.config), self.config)
            await runner.start()
            self.runner = runner
        await self.runner.step()
        if time.monotonic() - self._announced > PRESENCE_EVERY_S:
            await members.announce(self.redis, keys.projection_members(), self.name, PRESENCE_MS)
            self._announced = time.monotonic()
        if time.monotonic() - self._reported > REPORT_EVERY_S:
            self.runner.report_views()
            self._reported = time.monotonic()

    def _failed(self, state: RetryCallState) -> None:
        exc = state.outcome.exception()
        self.runner = None  # retried from the stored views: they are the truth
        self.outages.failed("server" if isinstance(exc, UNREACHABLE) else "projection step", exc)

    async def _pause(self, seconds: float) -> None:
        """The wait before a retry, cut short by a stop."""
        try:
            await asyncio.wait_for(self.stopping.wait(), seconds)
        except asyncio.TimeoutError:
            pass

    async def run(self) -> None:
        metrics.known_projections(list(PROJECTIONS))
        retrying = AsyncRetrying(
            retry=retry_if_exception_type(Exception), wait=wait_fixed(RETRY_AFTER_S), sleep=self._pause,
            before_sleep=self._failed, stop=lambda _: self.stopping.is_set(), reraise=True,
        )
        while not self.stopping.is_set():
            try:
                await retrying(self._step)
            except Exception:  # noqa: BLE001 - the step that failed as the stop came; nothing to retry for
                break
            self.outages.ok("projection step")
        with contextlib.suppress(Exception):  # a server already gone: the entry ages out by itself
            await members.announce(self.redis, keys.projection_members(), self.name, PRESENCE_MS, leaving=True)


async def serve(config: Config, url: str, metrics_port: int | None = None) -> None:
    redis = await connect(url, config.service)
    service = ProjectionService(config, redis)
    await serve_until_signalled(
        redis, service.run, service.stopping, health=service.health, probe=service.probe, outages=service.outages,
        what="projection", registry=metrics.PROJECTION_REGISTRY, metrics_port=metrics_port,
    )
