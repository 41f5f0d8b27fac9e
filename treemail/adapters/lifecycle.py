"""A long-running process's life, the same for the projection worker and the delivery pump: serve
/metrics, /healthz and /readyz, probe the server, run until SIGINT or SIGTERM, then stop in order.

The order of the stop: not ready first (a balancer stops sending before anything closes), then the
probe, then the HTTP endpoint (a thread join, off the loop), the connection last.
"""

import asyncio
import signal
from collections.abc import Awaitable, Callable

from prometheus_client import CollectorRegistry

from . import metrics
from .health import Health, OutageLog, Probe, watch


async def serve_until_signalled(
    redis, work: Callable[[], Awaitable[None]], stopping: asyncio.Event, *, health: Health, probe: Probe,
    outages: OutageLog, what: str, registry: CollectorRegistry, metrics_port: int | None,
) -> None:
    """Run ``work()`` with health probes until it returns; SIGINT and SIGTERM set ``stopping``, which ``work``
    ends on. ``metrics_port``: None or negative serves no endpoint, 0 a free port."""
    server = None
    if metrics_port is not None and metrics_port >= 0:
        server = metrics.start_server(metrics_port, what, registry, health)
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stopping.set)
    watcher = asyncio.create_task(watch(health, probe, outages, stopping.is_set))
    try:
        await work()
    finally:
        health.set(False, "stopping")
        watcher.cancel()
        await asyncio.gather(watcher, return_exceptions=True)
        if server is not None:
            await asyncio.to_thread(metrics.stop_server, server)
        await redis.aclose()
