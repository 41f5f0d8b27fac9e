"""The projection worker process: `treemail projections`."""

import asyncio
import logging
import signal

from treemail.adapters import metrics
from treemail.adapters.config import Config
from treemail.adapters.connection import connect
from treemail.adapters.eventstore import EventStore

from .runner import ProjectionRunner

log = logging.getLogger("treemail.projections")


async def serve(config: Config, url: str, metrics_port: int | None = None) -> None:
    redis = await connect(url, config.service)
    if metrics_port is not None and metrics_port >= 0:
        metrics.serve(metrics_port, "projection")
    stopping = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stopping.set)
    runner = ProjectionRunner(EventStore(redis, config.service), config)
    try:
        await runner.run(stopping)
    finally:
        await redis.aclose()
