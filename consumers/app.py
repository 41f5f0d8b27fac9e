"""The worker process: a FastStream Redis broker with batch subscribers on the command streams.

Each worker reads batches with XREADGROUP, in one consumer group, from the
command streams it owns (the live workers share them out, ``ownership``),
decides them (``services.sends``), answers each producer, and acknowledges
the batch in the same round trip. A reclaim task XAUTOCLAIMs commands of its
streams left pending by a dead worker for ``reclaim_idle_ms`` and decides
them again; idempotency makes that second decision return the first one's
result. The same periodic task trims what every reader has handled from the
command and wake streams (``retention.trim_handled``). On a stream no other
live worker reads, the next batch is read and decided while one waits for
the server (``batches_in_flight``).

Health: ``/healthz`` answers while the event loop ticks, ``/readyz`` while the
last probe (every second) found the server and the consumer group on every
command stream; a probe that finds the group gone (a server back without its
data) recreates it and restarts stopped subscribers. During an outage the
loops log one line per change of state (``OutageLog``), not a traceback per
retry.

Metrics: outcomes, latency and batch sizes are recorded per batch in
``handle``; stream and group statistics (backlog, pending, live consumers,
approvals waiting) are polled by a separate task every ``STATS_INTERVAL_S``,
off the hot path, and every worker reports the same group-wide values (so
dashboards take ``max``, not ``sum``, across workers).

The worker is a supervisor: it connects, builds one small part per loop and
starts and stops them together. Command batches (``batches``), the reclaim
pass with its trim and heal (``reclaim``, ``healing``), stream ownership and
membership (``sharing``), the health probe (``probe``) and the statistics
(``statsloop``); its subscribers, one per command stream, are ``subscribers``
(``commandsubscribers.py``).
"""

import asyncio
import gc
import logging
import os
import signal
import socket

from faststream.redis import RedisBroker, RedisClusterBroker
from faststream.redis.subscriber.usecases import stream_subscriber

from treemail.adapters import metrics, tracing
from treemail.adapters.config import Config
from treemail.adapters.connection import connect, redact, require_durable_server
from treemail.adapters.eventstore import EventStore
from treemail.adapters.replication import require_replicated_server
from treemail.adapters.health import Health, OutageLog, watch
from treemail.adapters.members import Membership
from treemail.domain.commands import SendMessage
from treemail.services import bootstrap
from treemail.services.clock import SYSTEM_CLOCK, Clock
from treemail.services.sends import Acknowledge, SendService

from .batches import SERVER_FAILURES, CommandBatches  # noqa: F401 - SERVER_FAILURES still importable from here
from .commandsubscribers import CommandSubscribers
from .healing import Healing
from .inflight import BatchesInFlight
from .periodic import PASS_DEADLINE_S, every
from .probe import HealthProbe
from .reclaim import Reclaim
from .sharing import STOP_STEP_S, StreamSharing  # noqa: F401 - STOP_STEP_S still importable from here
from .statsloop import STATS_INTERVAL_S, StatsRefresh  # noqa: F401 - STATS_INTERVAL_S still importable from here

log = logging.getLogger("treemail.worker")

# FastStream sleeps this long after a failed read (5 s by default): every send
# made during that time waits, long after the server is back. A worker should
# retry within a fraction of a second; the constant is read at each failure.
stream_subscriber.CONSUME_ERROR_BACKOFF_SECONDS = 0.25


class Worker:
    def __init__(
        self,
        config: Config,
        url: str,
        consumer: str | None = None,
        metrics_port: int | None = None,
        metrics_port_is_default: bool = False,
        clock: Clock = SYSTEM_CLOCK,
    ) -> None:
        """``metrics_port``: None serves no metrics, 0 a free port (``self.metrics_port`` after start).
        ``clock``: what its decisions are dated by (``treemail.testing`` passes one it can move forward)."""
        self.config = config
        self.clock = clock
        self.url = url
        self.consumer = consumer or f"{socket.gethostname()}-{os.getpid()}"
        broker_class = RedisClusterBroker if config.service.cluster else RedisBroker
        # No FastDepends: the handler takes no injected arguments (it reads the batch from the context), and
        # building its call model on every batch was about a twentieth of the worker at 2,000 sends/s.
        self.broker = broker_class(url, logger=None, graceful_timeout=30, apply_types=False)
        self.redis = None
        self.metrics_port = metrics_port
        self._metrics_port_is_default = metrics_port_is_default
        self._metrics_server = None
        self._tasks: dict[str, asyncio.Task] = {}
        self.health = Health()
        self.outages = OutageLog(log)
        self.membership: Membership | None = None
        self.in_flight = BatchesInFlight(config.service.batches_in_flight)
        # Built now, connected at start: the subscribers hand their batches to it from the first read.
        self.batches = CommandBatches(config.service, self.consumer, self.broker, self.in_flight, self.outages)
        # One subscriber per command stream; only the owned ones run (``share_streams``).
        self.subscribers = CommandSubscribers(self.broker, config.service, self.consumer, self.batches.handle_current)
        # The loops' parts, built at start once the worker is connected.
        self.healing: Healing | None = None
        self.reclaiming: Reclaim | None = None
        self.sharing: StreamSharing | None = None
        self.prober: HealthProbe | None = None
        self.stats: StatsRefresh | None = None
        self._stopping = False

    # ---- what the parts do, under the worker's names -----------------------------------------

    @property
    def owned(self) -> frozenset[int]:
        """The command streams this worker reads (by index)."""
        return self.subscribers.owned

    @property
    def decider(self) -> SendService | None:
        return self.batches.decider

    @property
    def decided(self) -> int:
        return self.batches.decided

    @property
    def step_deadline_s(self) -> float:
        return self.batches.step_deadline_s

    async def handle(self, message) -> None:
        await self.batches.handle(message)

    async def decide_commands(self, commands: list[SendMessage], acknowledge: Acknowledge | None = None) -> None:
        await self.batches.decide_commands(commands, acknowledge)

    async def reclaim(self) -> int:
        return await self.reclaiming.reclaim()

    async def trim(self) -> int:
        return await self.reclaiming.trim()

    async def heal(self) -> int:
        return await self.healing.heal()

    async def share_streams(self) -> None:
        await self.sharing.share()

    async def probe(self) -> str | None:
        return await self.prober.probe()

    async def refresh_stats(self) -> None:
        await self.stats.refresh()

    # ---- life cycle ----------------------------------------------------------------------------

    async def start(self) -> None:
        service = self.config.service
        self.redis = await connect(self.url, service, per_reply_timeout=False)
        if service.profile == "durable":
            await require_durable_server(self.redis, service.cluster)
        elif service.profile == "replicated":
            await require_replicated_server(self.redis, service)
        # Its bootstrap: the services first, the parts over them once the broker is connected.
        services = bootstrap.worker(self.redis, self.config, self.clock)
        await services.store.ensure_command_group(service.command_streams)
        await services.store.load_scripts()
        self.batches.connect(self.redis, services.decider)
        if self.metrics_port is not None:
            self._metrics_server = metrics.start_server(
                self.metrics_port, f"worker {self.consumer}", metrics.WORKER_REGISTRY, self.health,
                free_port_if_taken=self._metrics_port_is_default,
            )
            self.metrics_port = self._metrics_server.server_address[1]
        # Connected, not started: starting the broker would start every subscriber, and a worker reads only
        # the streams it owns (``share_streams``).
        await self.broker.connect()
        self.membership = Membership(self.redis, (self.consumer, service.command_streams), service.worker_timeout_ms)
        self._build_parts(services.store)
        await self.share_streams()
        self._start_loops()

    def _build_parts(self, store: EventStore) -> None:
        service, redis, consumer = self.config.service, self.redis, self.consumer
        self.healing = Healing(service, redis, store, self.subscribers)
        self.reclaiming = Reclaim(service, consumer, redis, self.batches, self.healing, lambda: self.owned)
        self.sharing = StreamSharing(service, consumer, redis, self.membership, self.subscribers, self.in_flight,
                                     self.batches, self.healing, self.outages)
        self.prober = HealthProbe(service, consumer, redis, self.healing, self.subscribers, self.in_flight)
        self.stats = StatsRefresh(service, redis, lambda: self._stopping, self.outages)

    def _start_loops(self) -> None:
        service = self.config.service

        def stopping() -> bool:
            return self._stopping

        # The pass's deadline, not the heartbeat's: a step that gives a stream up waits for the batches in
        # hand and decides what it read of it, and cutting that short would leave it to reclaim.
        loops = {
            "treemail-worker-membership": every(self.membership.interval_s, PASS_DEADLINE_S, "membership",
                                                self.share_streams, stopping, self.outages),
            "treemail-worker-reclaim": every(service.reclaim_idle_ms / 2000, PASS_DEADLINE_S, "reclaim pass",
                                             self.reclaiming.run_pass, stopping, self.outages),
            "treemail-worker-health": watch(self.health, self.probe, self.outages, stopping),
        }
        if self._metrics_server is not None:  # nobody would read the gauges otherwise
            loops["treemail-worker-stats"] = self.stats.run()
        self._tasks = {name: asyncio.create_task(loop, name=name) for name, loop in loops.items()}

    async def stop(self) -> None:
        """Finish the batch in hand, take no new commands, close."""
        self._stopping = True
        self.health.set(False, "stopping")
        # Membership last: the others keep seeing this worker alive until its loops are down.
        for name in ("treemail-worker-stats", "treemail-worker-reclaim", "treemail-worker-health",
                     "treemail-worker-membership"):
            task = self._tasks.get(name)
            if task is not None:
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)
        if self.sharing is not None:
            await self.sharing.leave()
        await self.broker.stop()
        # The batches FastStream handed over before it stopped reading are finished, not cut short.
        await self.in_flight.finish(timeout=self.step_deadline_s)
        if self.sharing is not None:
            await self.sharing.finish_owned_pending()
        if self._metrics_server is not None:
            # A thread join, off the loop: shutdown waits for serve_forever's next poll.
            await asyncio.to_thread(metrics.stop_server, self._metrics_server)
            self._metrics_server = None
        if self.redis is not None:
            await self.redis.aclose()


# CPython collects its youngest generation every 700 net allocations. A batch allocates thousands of
# short-lived objects, and the collections (each also walking what start-up loaded) were about a seventh
# of a worker's CPU (BENCHMARKS.md). Garbage in cycles now waits a little longer to be freed.
GC_YOUNG_THRESHOLD = 50_000


def settle_heap() -> None:
    """Once the worker has started: what start-up loaded (modules, models, connections) is frozen, never
    walked by a collection again, and the youngest generation is collected less often."""
    gc.freeze()
    gc.set_threshold(GC_YOUNG_THRESHOLD, *gc.get_threshold()[1:])


async def serve(
    config: Config, url: str, metrics_port: int | None = None, metrics_port_is_default: bool = False
) -> None:
    tracing.configure_from_env()
    worker = Worker(config, url, metrics_port=metrics_port, metrics_port_is_default=metrics_port_is_default)
    stopping = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stopping.set)
    await worker.start()
    settle_heap()
    log.info("worker %s deciding commands on %s", worker.consumer, redact(url))
    await stopping.wait()
    await worker.stop()
