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

Over the house's 200 lines: the worker's life cycle (share the streams out,
decide, reclaim, trim, heal, stop) reads best as one class; its subscribers,
one per command stream, are ``subscribers`` (``commandsubscribers.py``).
"""

import asyncio
import gc
import logging
import os
import signal
import socket
import time

from faststream.redis import RedisBroker, RedisClusterBroker
from faststream.redis.subscriber.usecases import stream_subscriber
from redis.exceptions import ClusterDownError, MovedError, ReadOnlyError, RedisClusterException, TryAgainError
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError
from redis.exceptions import ResponseError as RedisResponseError

from treemail.adapters import keys, metrics, tracing
from treemail.adapters.codec import encode_answer
from treemail.adapters.config import Config
from treemail.adapters.connection import REPLY_TIMEOUT_S, connect, redact, require_durable_server
from treemail.adapters.eventstore import EventStore
from treemail.adapters.proofkeys import load_keyring
from treemail.adapters.replication import NotReplicated, not_replicated_result, require_replicated_server
from treemail.adapters.retention import trim_handled
from treemail.adapters.health import UNREACHABLE, Health, OutageLog, watch
from treemail.adapters.members import Membership
from treemail.domain.commands import SendMessage
from treemail.services.clock import SYSTEM_CLOCK, Clock
from treemail.services.sends import SendService

from . import decisionspans
from .deadletters import Letter, dead_letter, gave_up
from .entries import split_malformed, text
from .inflight import BatchesInFlight
from .ownership import owned_streams
from .stats import live_readers, record_batch, refresh_stats, server_unreachable
from .commandsubscribers import CommandSubscribers

log = logging.getLogger("treemail.worker")

# The server, not a command: every command of the batch would fail alone as well. A cluster failing over
# answers these until its replica is promoted and the client's slot map follows; the batch stays pending
# and is decided again, rather than each command being tried alone and counted towards its dead letter.
SERVER_FAILURES = (RedisConnectionError, RedisTimeoutError, ClusterDownError, TryAgainError, MovedError,
                   ReadOnlyError, RedisClusterException)

# FastStream sleeps this long after a failed read (5 s by default): every send
# made during that time waits, long after the server is back. A worker should
# retry within a fraction of a second; the constant is read at each failure.
stream_subscriber.CONSUME_ERROR_BACKOFF_SECONDS = 0.25
STATS_INTERVAL_S = 5.0
# The periodic passes (reclaim, trim, stats) run on the worker's connection, which has no timer per
# reply: each pass as a whole gives up after this long and is tried again at the next interval.
PASS_DEADLINE_S = 60.0
# A stopping worker's steps on the server (leaving the members set, deciding what it read and dropped) give
# up after this long each: what is left then is taken over as a dead worker's would be.
STOP_STEP_S = 5.0


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
        self.decider: SendService | None = None
        self.redis = None
        self.decided = 0
        self.metrics_port = metrics_port
        self._metrics_port_is_default = metrics_port_is_default
        self._metrics_server = None
        self._stats_task: asyncio.Task | None = None
        self._reclaim_task: asyncio.Task | None = None
        self._health_task: asyncio.Task | None = None
        self._membership_task: asyncio.Task | None = None
        self.health = Health()
        self.outages = OutageLog(log)
        self.membership: Membership | None = None
        # One subscriber per command stream; only the owned ones run (``share_streams``).
        self.subscribers = CommandSubscribers(self.broker, config.service, self.consumer, self._handle_current)
        self.in_flight = BatchesInFlight(config.service.batches_in_flight)
        self._stopping = False
        # The probe and the reclaim pass both heal; one at a time, so a loss is mended and logged once.
        self._healing = asyncio.Lock()

    @property
    def owned(self) -> frozenset[int]:
        """The command streams this worker reads (by index)."""
        return self.subscribers.owned

    async def _handle_current(self, body=None) -> None:
        # The batch from the broker's context: a ``RedisBatchStreamMessage`` parameter is a dependency
        # that fast_depends resolves in a worker thread, a thread hop per batch.
        message = self.broker.context.get_local("message")
        stream = message.raw_message["channel"]
        # Held states others keep changing (``heldreads``) would make a second batch conflict as well.
        if self.in_flight.may_take(stream) and not self.decider.held.paused:
            await self.in_flight.take(stream, lambda: self._handle_reported(message))
        else:
            await self.handle(message)

    async def _handle_reported(self, message) -> None:
        """``handle`` for a batch in flight, where no FastStream loop takes what it raises: it stays pending."""
        try:
            await self.handle(message)
            self.outages.ok("batch")
        except Exception as exc:  # noqa: BLE001 - the batch stays pending and is reclaimed, as FastStream would
            self._failed("batch", exc)

    async def handle(self, message) -> None:
        """A batch read by XREADGROUP (a ``RedisBatchStreamMessage``): acknowledged with its answers; raising
        leaves the rest pending."""
        stream = message.raw_message["channel"]
        entries = list(zip(message.raw_message["message_ids"], message.raw_message["data"]))
        parsed, unreadable = split_malformed(entries)
        if unreadable:
            # No worker will ever decide these: set them aside now rather than after max_deliveries.
            await self._dead_letter(stream, unreadable)
        try:
            await self.decide_commands([command for _, command in parsed], (stream, [i for i, _ in parsed]))
        except SERVER_FAILURES:
            raise
        except Exception:  # noqa: BLE001 - one failing command must not hold its batch back until reclaim
            log.warning("a batch of %d failed; deciding its commands one by one", len(parsed), exc_info=True)
            if await self._decide_alone(stream, parsed):
                # The failed ones stay pending (their delivery count grows); the others were acknowledged.
                raise

    async def decide_commands(self, commands: list[SendMessage], acknowledge: tuple[str, list] | None = None) -> None:
        """Decide, make durable, answer, and then acknowledge ``acknowledge`` (stream, entry ids), in the
        round trip of the answers: an entry is acknowledged only after its decision is durable and
        answered (the server runs the pipeline in order).

        The worker's connection has no timer per reply (``connect``): the whole batch is bounded
        instead, and a server silent past the bound fails the batch as a lost connection would
        (it stays pending; a decision cut short is decided again, idempotently).
        """
        if not commands:
            return
        try:
            async with asyncio.timeout(self.step_deadline_s):
                await self._decide_and_answer(commands, acknowledge)
        except TimeoutError:
            raise RedisTimeoutError(f"no answer from the server within {self.step_deadline_s:g} s") from None
        except NotReplicated as unconfirmed:
            # Written, not confirmed on enough replicas: every command of the batch is answered that its
            # outcome is unknown (a retry of the same call resolves it from its idempotency record), and
            # acknowledged: deciding it again here would only wait for the same replicas again.
            log.warning("a batch of %d was not confirmed by its replicas: %s", len(commands), unconfirmed)
            answer = not_replicated_result(unconfirmed)
            entries = acknowledge[1] if acknowledge is not None else [None] * len(commands)
            await self._answer(list(zip(commands, entries)), {c.command_id: answer for c in commands},
                               acknowledge[0] if acknowledge is not None else None)

    @property
    def step_deadline_s(self) -> float:
        # Past reclaim_idle_ms another worker may take the batch over anyway; never below a reply's own bound.
        return max(REPLY_TIMEOUT_S, self.config.service.reclaim_idle_ms / 1000)

    async def _decide_and_answer(self, commands: list[SendMessage], acknowledge: tuple[str, list] | None) -> None:
        started = time.perf_counter()
        spans = decisionspans.start(commands)
        outcomes, done = await self.decider.decide(commands, acknowledge)
        # The rest: commands whose append did not answer them (``SendService.decide``), and their entries.
        entries = acknowledge[1] if acknowledge is not None else [None] * len(commands)
        rest = [(command, entry) for command, entry in zip(commands, entries) if entry is None or entry not in done]
        if rest:
            await self._answer(rest, outcomes, acknowledge[0] if acknowledge is not None else None)
        self.decided += len(commands)
        record_batch(commands, outcomes, time.perf_counter() - started)
        decisionspans.end(spans, commands, outcomes)

    async def _answer(self, rest: list[tuple[SendMessage, object]], outcomes: dict[str, dict], stream: str | None
                      ) -> None:
        """Answer ``rest`` (command, entry id or None) and then acknowledge their entries of ``stream``."""
        answers: dict[str, list[str]] = {}
        for command, _ in rest:
            answer = encode_answer(command.command_id, outcomes[command.command_id])
            answers.setdefault(command.reply_to, []).append(answer)
        entry_ids = [entry for _, entry in rest if entry is not None]
        # One server: answers and acknowledgement in one transaction (a refused answer leaves the batch
        # pending). A cluster spreads them over nodes with no order between them: acknowledge after.
        together = stream is not None and not self.config.service.cluster
        async with self.redis.pipeline(transaction=together) as pipe:
            for reply_to, values in answers.items():
                pipe.lpush(keys.reply_list(reply_to), *values)
                pipe.expire(keys.reply_list(reply_to), keys.REPLY_TTL_S)
            if together:
                pipe.xack(stream, keys.COMMAND_GROUP, *entry_ids)
            await pipe.execute()
        if stream is not None and not together:
            await self.redis.xack(stream, keys.COMMAND_GROUP, *entry_ids)

    async def reclaim(self) -> int:
        """Take over commands idle in a dead (or stuck) consumer's pending list and decide them.

        FastStream's own XAUTOCLAIM subscriber claims one entry per round trip;
        this claims a batch at a time. A command delivered more than
        ``max_deliveries`` times is poison (its decision keeps failing): it
        moves to the dead-letter stream with the reason, and its producer is
        told, instead of blocking the stream forever.
        """
        service = self.config.service
        taken = 0
        for index in sorted(self.owned):  # a stream's owner decides its commands, new or reclaimed
            stream = keys.command_stream(index)
            start = "0-0"
            while True:
                start, entries, *_ = await self.redis.xautoclaim(
                    stream, keys.COMMAND_GROUP, self.consumer, service.reclaim_idle_ms, start_id=start,
                    count=service.batch_size,
                )
                live = [(entry_id, fields) for entry_id, fields in entries if fields]
                if live:
                    taken += await self._decide_reclaimed(stream, live)
                if start in (b"0-0", "0-0"):
                    break
        return taken

    async def trim(self) -> int:
        """Drop commands and wakes every reader has handled (they are queues; the session streams are history).

        Run by the periodic task beside reclaim; any number of workers may trim at once.
        """
        service = self.config.service
        dropped = 0
        for index in range(service.command_streams):
            dropped += await trim_handled(self.redis, keys.command_stream(index), keys.COMMAND_GROUP)
        for partition in range(service.partitions):
            dropped += await trim_handled(self.redis, keys.wake_stream(partition), keys.WAKE_GROUP)
        return dropped

    async def _decide_reclaimed(self, stream: str, entries: list) -> int:
        ids = [entry_id for entry_id, _ in entries]
        pending = await self.redis.xpending_range(
            stream, keys.COMMAND_GROUP, min=ids[0], max=ids[-1], count=len(ids) * 2, consumername=self.consumer
        )
        deliveries = {p["message_id"]: p["times_delivered"] for p in pending}
        limit = self.config.service.max_deliveries
        parsed, unreadable = split_malformed(entries)
        fields_of = dict(entries)
        poison = [
            Letter(i, fields_of[i], "max_deliveries", answer=(command.reply_to, {
                "command_id": command.command_id, **gave_up(limit)}))
            for i, command in parsed if deliveries.get(i, 0) > limit
        ]
        good = [(i, command) for i, command in parsed if deliveries.get(i, 0) <= limit]
        if unreadable or poison:
            await self._dead_letter(stream, unreadable + poison)
        if not good:
            return len(entries)
        try:
            await self.decide_commands([command for _, command in good], (stream, [entry_id for entry_id, _ in good]))
        except Exception:  # noqa: BLE001 - isolate the command that fails; the others go through
            log.warning("a reclaimed batch failed; deciding its commands one by one", exc_info=True)
            await self._decide_alone(stream, good)
        return len(entries)

    async def _decide_alone(self, stream: str, commands: list[tuple]) -> int:
        """Decide and acknowledge each command by itself; returns how many failed (they stay pending)."""
        failed = 0
        for entry_id, command in commands:
            try:
                await self.decide_commands([command], (stream, [entry_id]))
            except Exception:  # noqa: BLE001 - stays pending; its delivery count grows
                failed += 1
                log.warning("command %s failed", text(entry_id), exc_info=True)
        return failed

    async def _dead_letter(self, stream: str, letters: list[Letter]) -> None:
        await dead_letter(self.redis, stream, letters, self.consumer)

    async def heal(self) -> int:
        """Recreate a lost command group and restart the subscribers FastStream stopped on its loss.

        A server back without its data (no AOF, a flush) has no consumer group: whichever meets it first,
        this probe or a subscriber's read (NOGROUP, which stops it for good), the worker reads again and
        says so in one log line. Returns how many streams or subscribers it mended.
        """
        async with self._healing:
            lost = await self._streams_without_group()
            if lost:
                await self._ensure_group()
            restarted = await self.subscribers.revive(self._ensure_group)
        if lost or restarted:
            log.warning("the server had lost the command streams' consumer group: recreated it on %d stream(s) "
                        "and restarted %d stopped subscriber(s); reading commands again", len(lost), restarted)
        return len(lost) + restarted

    async def _ensure_group(self) -> None:
        await self.decider.store.ensure_command_group(self.config.service.command_streams)

    async def share_streams(self) -> None:
        """Say this worker is alive, then read the command streams it owns now and stop reading the others
        (``ownership``); every stream when ``exclusive_streams`` is off."""
        service = self.config.service
        live = await self.membership.beat()
        owned = (owned_streams(live, self.membership.me) if service.exclusive_streams
                 else frozenset(range(service.command_streams)))
        if owned != self.owned:
            log.info("worker %s reads command streams %s of %d (%d live workers)", self.consumer,
                     sorted(owned), service.command_streams, len(live))
        released = await self.subscribers.own(owned, self._ensure_group)
        if service.exclusive_streams and service.batches_in_flight > 1:
            self.in_flight.read_alone = frozenset(keys.command_stream(index) for index in owned)
        for stream in released:
            await self._finish_pending(stream)

    async def _finish_pending(self, stream: str) -> None:
        """Decide what this worker read of ``stream`` and has not handled. A stopped subscriber drops the
        batch of a read that was on the wire: it stays in this worker's pending list, where only reclaim,
        ``reclaim_idle_ms`` later, would find it."""
        await self.in_flight.finish(timeout=self.step_deadline_s)
        replies = await self.redis.xreadgroup(keys.COMMAND_GROUP, self.consumer, {stream: "0"},
                                              count=self.config.service.batch_size)
        for _, entries in replies:
            live = [(entry_id, fields) for entry_id, fields in entries if fields]
            if live:
                await self._decide_reclaimed(stream, live)

    async def _every(self, interval_s: float, deadline_s: float, subject: str, step) -> None:
        """``step`` every ``interval_s`` until the worker stops. One that fails or takes over ``deadline_s`` is
        reported (once per change of state) and tried again at the next interval."""
        # The flag, not only cancellation, ends the loop: a client library that swallows a
        # CancelledError mid-command must not keep a stopping worker alive.
        while not self._stopping:
            await asyncio.sleep(interval_s)
            if self._stopping:
                return
            try:
                async with asyncio.timeout(deadline_s):
                    await step()
                self.outages.ok(subject)
            except asyncio.CancelledError:
                raise
            except TimeoutError:
                self._failed(subject, RedisTimeoutError(f"{subject} not done within {deadline_s:g} s"))
            except Exception as exc:  # noqa: BLE001 - tried again at the next interval
                self._failed(subject, exc)

    async def _reclaim_pass(self) -> None:
        await self.heal()
        await self.reclaim()
        await self.trim()

    def _failed(self, subject: str, exc: Exception) -> None:
        # Lost connections are the health probe's to report, once, as the server's state.
        self.outages.failed("server" if isinstance(exc, UNREACHABLE) else subject, exc)

    async def _streams_without_group(self) -> list[str]:
        missing = []
        for index in range(self.config.service.command_streams):
            stream = keys.command_stream(index)
            try:
                groups = await self.redis.xinfo_groups(stream)
            except RedisResponseError:  # no such key: the stream is gone with the server's data
                groups = []
            if not any(text(g["name"]) == keys.COMMAND_GROUP for g in groups):
                missing.append(stream)
        return missing

    async def probe(self) -> str | None:
        """None when ready; otherwise why not. Heals what it can: a lost group, stopped subscribers."""
        await self.redis.ping()
        await self.heal()
        missing = await self._streams_without_group()
        if missing:
            return f"consumer group {keys.COMMAND_GROUP} missing on {', '.join(missing)}"
        stopped = len(self.subscribers.stopped())
        if stopped:
            return f"{stopped} command stream subscriber(s) stopped"
        if not self.config.service.exclusive_streams:
            await self._note_streams_read_alone()
        return None

    async def _note_streams_read_alone(self) -> None:
        service = self.config.service
        if service.batches_in_flight == 1:
            return
        alone = []
        for stream in (keys.command_stream(index) for index in range(service.command_streams)):
            if not await live_readers(self.redis, stream, service, besides=self.consumer):
                alone.append(stream)
        self.in_flight.read_alone = frozenset(alone)

    async def _leave(self) -> None:
        """Leave the members set first, so the others take the streams over at their next beat, not after
        ``worker_timeout_ms``."""
        if self.membership is None:
            return
        try:
            async with asyncio.timeout(STOP_STEP_S):
                await self.membership.leave()
        except Exception as exc:  # noqa: BLE001 - the others take over after the timeout instead
            self._failed("leaving the members set", exc)

    async def _finish_owned_pending(self) -> None:
        try:
            async with asyncio.timeout(STOP_STEP_S):
                for index in sorted(self.owned):
                    await self._finish_pending(keys.command_stream(index))
        except Exception as exc:  # noqa: BLE001 - what is left is reclaimed by the streams' next owners
            self._failed("finishing the pending commands", exc)

    async def refresh_stats(self) -> None:
        await refresh_stats(self.redis, self.config.service)

    async def _stats_loop(self) -> None:
        while not self._stopping:
            try:
                async with asyncio.timeout(PASS_DEADLINE_S):
                    await self.refresh_stats()
                self.outages.ok("stats refresh")
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # noqa: BLE001 - observability must never stop a worker deciding
                if isinstance(exc, UNREACHABLE):
                    server_unreachable(self.config.service)
                self._failed("stats refresh", exc)
            await asyncio.sleep(STATS_INTERVAL_S)

    async def start(self) -> None:
        self.redis = await connect(self.url, self.config.service, per_reply_timeout=False)
        if self.config.service.profile == "durable":
            await require_durable_server(self.redis, self.config.service.cluster)
        elif self.config.service.profile == "replicated":
            await require_replicated_server(self.redis, self.config.service)
        store = EventStore(self.redis, self.config.service)
        await store.ensure_command_group(self.config.service.command_streams)
        await store.load_scripts()
        self.decider = SendService(store, self.config.messaging, load_keyring(self.config.proof), clock=self.clock)
        if self.metrics_port is not None:
            self._metrics_server = metrics.start_server(
                self.metrics_port, f"worker {self.consumer}", metrics.WORKER_REGISTRY, self.health,
                free_port_if_taken=self._metrics_port_is_default,
            )
            self.metrics_port = self._metrics_server.server_address[1]
        # Connected, not started: starting the broker would start every subscriber, and a worker reads only
        # the streams it owns (``share_streams``).
        await self.broker.connect()
        service = self.config.service
        self.membership = Membership(self.redis, (self.consumer, service.command_streams), service.worker_timeout_ms)
        await self.share_streams()
        # The pass's deadline, not the heartbeat's: a step that gives a stream up waits for the batches in
        # hand and decides what it read of it, and cutting that short would leave it to reclaim.
        self._membership_task = asyncio.create_task(self._every(
            self.membership.interval_s, PASS_DEADLINE_S, "membership", self.share_streams,
        ), name="treemail-worker-membership")
        self._reclaim_task = asyncio.create_task(self._every(
            service.reclaim_idle_ms / 2000, PASS_DEADLINE_S, "reclaim pass", self._reclaim_pass,
        ), name="treemail-worker-reclaim")
        self._health_task = asyncio.create_task(
            watch(self.health, self.probe, self.outages, lambda: self._stopping), name="treemail-worker-health"
        )
        if self._metrics_server is not None:  # nobody would read the gauges otherwise
            self._stats_task = asyncio.create_task(self._stats_loop(), name="treemail-worker-stats")

    async def stop(self) -> None:
        """Finish the batch in hand, take no new commands, close."""
        self._stopping = True
        self.health.set(False, "stopping")
        for task in (self._stats_task, self._reclaim_task, self._health_task, self._membership_task):
            if task is not None:
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)
        await self._leave()
        await self.broker.stop()
        # The batches FastStream handed over before it stopped reading are finished, not cut short.
        await self.in_flight.finish(timeout=self.step_deadline_s)
        await self._finish_owned_pending()
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
