"""The worker process: a FastStream Redis broker with batch subscribers on the command streams.

Each worker reads batches with XREADGROUP from every command stream in one
consumer group, decides them (consumers.sends), answers each producer, and
only then lets FastStream XACK the batch. A second subscriber per stream
XAUTOCLAIMs commands left pending by a dead worker for ``reclaim_idle_ms``
and decides them again; idempotency makes that second decision return the
first one's result.

Metrics: outcomes, latency and batch sizes are recorded per batch in
``handle``; stream and group statistics (backlog, pending, live consumers,
approvals waiting) are polled by a separate task every ``STATS_INTERVAL_S``,
off the hot path, and every worker reports the same group-wide values (so
dashboards take ``max``, not ``sum``, across workers).
"""

import asyncio
import json
import logging
import os
import signal
import socket
import time

from faststream.redis import RedisBroker, StreamSub
from faststream.redis.annotations import RedisBatchStreamMessage

from treemail import keys, metrics
from treemail.config import Config
from treemail.connection import connect, require_durable_server

from .approvals import ApprovalStore
from .eventstore import EventStore
from .sends import SendDecider, parse_command

log = logging.getLogger("treemail.worker")
REPLY_TTL_S = 120
STATS_INTERVAL_S = 5.0
# A consumer idle longer than this is not counted as a live worker: a live one
# polls every 100 ms, and a dead one stays in XINFO CONSUMERS until deleted.
LIVE_CONSUMER_IDLE_MS = 60_000


def outcome_label(outcome: dict) -> str:
    """The bounded ``outcome`` label of one decision: ok, approval_pending or the error code."""
    if "ok" in outcome:
        return "ok"
    if "approval" in outcome:
        return "approval_pending"
    if "error" in outcome:
        return outcome["error"]["code"]
    return "unknown"


class Worker:
    def __init__(
        self,
        config: Config,
        url: str,
        consumer: str | None = None,
        metrics_port: int | None = None,
        metrics_port_is_default: bool = False,
    ) -> None:
        """``metrics_port``: None serves no metrics, 0 a free port (``self.metrics_port`` after start)."""
        self.config = config
        self.url = url
        self.consumer = consumer or f"{socket.gethostname()}-{os.getpid()}"
        self.broker = RedisBroker(url, logger=None, graceful_timeout=30)
        self.decider: SendDecider | None = None
        self.redis = None
        self.decided = 0
        self.metrics_port = metrics_port
        self._metrics_port_is_default = metrics_port_is_default
        self._metrics_server = None
        self._stats_task: asyncio.Task | None = None
        self._subscribe()

    def _subscribe(self) -> None:
        service = self.config.service
        for index in range(service.command_streams):
            stream = keys.command_stream(index)
            live = StreamSub(
                stream, group=keys.COMMAND_GROUP, consumer=self.consumer, batch=True,
                max_records=service.batch_size, polling_interval=100,
            )
            reclaim = StreamSub(
                stream, group=keys.COMMAND_GROUP, consumer=self.consumer, batch=True,
                max_records=service.batch_size, min_idle_time=service.reclaim_idle_ms,
                polling_interval=max(100, service.reclaim_idle_ms // 4),
            )
            self.broker.subscriber(stream=live)(self.handle)
            self.broker.subscriber(stream=reclaim)(self.handle)

    async def handle(self, message: RedisBatchStreamMessage) -> None:
        started = time.perf_counter()
        entries = message.raw_message["data"]
        commands = [parse_command(entry[b"__data__"]) for entry in entries]
        outcomes = await self.decider.decide(commands)
        async with self.redis.pipeline(transaction=False) as pipe:
            for command in commands:
                reply = keys.reply_list(command.reply_to)
                pipe.lpush(reply, json.dumps({"command_id": command.command_id, **outcomes[command.command_id]}))
                pipe.expire(reply, REPLY_TTL_S)
            await pipe.execute()
        self.decided += len(commands)
        self._record(commands, outcomes, time.perf_counter() - started)
        # Returning lets FastStream XACK the whole batch: every decision above is durable.

    @staticmethod
    def _record(commands, outcomes: dict[str, dict], elapsed: float) -> None:
        # Every command of a batch waited for the whole batch, so each observes its wall time.
        metrics.BATCH_SIZE.observe(len(commands))
        for command in commands:
            metrics.SENDS.labels(outcome_label(outcomes[command.command_id])).inc()
            metrics.DECISION_SECONDS.observe(elapsed)

    async def refresh_stats(self) -> None:
        """Set the group and approval gauges from the server (the periodic task calls this)."""
        for index in range(self.config.service.command_streams):
            stream = keys.command_stream(index)
            for group in await self.redis.xinfo_groups(stream):
                if _text(group["name"]) != keys.COMMAND_GROUP:
                    continue
                # lag is nil when the server cannot compute it (entries deleted); keep the last value.
                if group.get("lag") is not None:
                    metrics.COMMAND_BACKLOG.labels(stream).set(group["lag"])
                metrics.COMMAND_PENDING.labels(stream).set(group["pending"])
            consumers = await self.redis.xinfo_consumers(stream, keys.COMMAND_GROUP)
            live = sum(1 for c in consumers if c["idle"] < LIVE_CONSUMER_IDLE_MS)
            metrics.WORKER_CONSUMERS.labels(stream).set(live)
        metrics.APPROVALS_PENDING.set(await self.redis.zcard(keys.approvals_pending()))

    async def _stats_loop(self) -> None:
        while True:
            try:
                await self.refresh_stats()
            except asyncio.CancelledError:
                raise
            except Exception:  # noqa: BLE001 - observability must never stop a worker deciding
                log.warning("worker stats refresh failed", exc_info=True)
            await asyncio.sleep(STATS_INTERVAL_S)

    async def start(self) -> None:
        self.redis = await connect(self.url, self.config.service)
        if self.config.service.profile == "durable":
            await require_durable_server(self.redis)
        store = EventStore(self.redis, self.config.service)
        await store.ensure_command_group(self.config.service.command_streams)
        await store.load_scripts()
        self.decider = SendDecider(store, ApprovalStore(store), self.config.messaging)
        if self.metrics_port is not None:
            self._metrics_server = metrics.start_server(
                self.metrics_port, f"worker {self.consumer}", free_port_if_taken=self._metrics_port_is_default
            )
            self.metrics_port = self._metrics_server.server_address[1]
        await self.broker.start()
        if self._metrics_server is not None:  # nobody would read the gauges otherwise
            self._stats_task = asyncio.create_task(self._stats_loop(), name="treemail-worker-stats")

    async def stop(self) -> None:
        """Finish the batch in hand, take no new commands, close."""
        if self._stats_task is not None:
            self._stats_task.cancel()
            await asyncio.gather(self._stats_task, return_exceptions=True)
        await self.broker.stop()
        if self._metrics_server is not None:
            # A thread join, off the loop: shutdown waits for serve_forever's next poll.
            await asyncio.to_thread(metrics.stop_server, self._metrics_server)
            self._metrics_server = None
        if self.redis is not None:
            await self.redis.aclose()


def _text(value) -> str:
    return value.decode() if isinstance(value, bytes) else value


async def serve(
    config: Config, url: str, metrics_port: int | None = None, metrics_port_is_default: bool = False
) -> None:
    worker = Worker(config, url, metrics_port=metrics_port, metrics_port_is_default=metrics_port_is_default)
    stopping = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stopping.set)
    await worker.start()
    log.info("worker %s deciding commands on %s", worker.consumer, url)
    await stopping.wait()
    await worker.stop()
