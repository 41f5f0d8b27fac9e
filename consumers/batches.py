"""Command batches: each batch read is decided (``services.sends``), its producers answered, its entries
acknowledged in the same round trip. A batch that fails is decided command by command, so one failing
command cannot hold the others back until reclaim; what no worker can ever decide is set aside as a dead
letter. On a stream no other live worker reads, the next batch is read and decided while one waits for the
server (``batches_in_flight``).
"""

import asyncio
import logging
import time
from typing import NamedTuple

from redis.exceptions import ClusterDownError, MovedError, ReadOnlyError, RedisClusterException, TryAgainError
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from treemail.adapters import keys
from treemail.adapters.codec import encode_answer
from treemail.adapters.config import ServiceConfig
from treemail.adapters.connection import REPLY_TIMEOUT_S
from treemail.adapters.health import OutageLog
from treemail.adapters.replication import NotReplicated, not_replicated_result
from treemail.domain.commands import SendMessage
from treemail.services.sends import Acknowledge, SendService

from . import decisionspans
from .deadletters import Letter, dead_letter, gave_up
from .entries import split_malformed, text
from .inflight import BatchesInFlight
from .periodic import report_failure
from .stats import record_batch

log = logging.getLogger("treemail.worker")

# The server, not a command: every command of the batch would fail alone as well. A cluster failing over
# answers these until its replica is promoted and the client's slot map follows; the batch stays pending
# and is decided again, rather than each command being tried alone and counted towards its dead letter.
SERVER_FAILURES = (RedisConnectionError, RedisTimeoutError, ClusterDownError, TryAgainError, MovedError,
                   ReadOnlyError, RedisClusterException)


class Unanswered(NamedTuple):
    """A command the worker answers itself (its append did not), and its entry to acknowledge (None: none)."""

    command: SendMessage
    entry_id: object


class CommandBatches:
    def __init__(self, config: ServiceConfig, consumer: str, broker, in_flight: BatchesInFlight,
                 outages: OutageLog) -> None:
        self.config = config
        self.consumer = consumer
        self.broker = broker
        self.in_flight = in_flight
        self.outages = outages
        # The worker's connection and decider, from its start (``connect``).
        self.redis = None
        self.decider: SendService | None = None
        self.decided = 0

    def connect(self, redis, decider: SendService) -> None:
        self.redis, self.decider = redis, decider

    async def handle_current(self, body=None) -> None:
        """The subscribers' handler."""
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
            report_failure(self.outages, "batch", exc)

    async def handle(self, message) -> None:
        """A batch read by XREADGROUP (a ``RedisBatchStreamMessage``): acknowledged with its answers; raising
        leaves the rest pending."""
        stream = message.raw_message["channel"]
        entries = list(zip(message.raw_message["message_ids"], message.raw_message["data"]))
        parsed, unreadable = split_malformed(entries)
        if unreadable:
            # No worker will ever decide these: set them aside now rather than after max_deliveries.
            await self.dead_letter(stream, unreadable)
        try:
            await self.decide_commands([command for _, command in parsed], Acknowledge(stream, [i for i, _ in parsed]))
        except SERVER_FAILURES:
            raise
        except Exception:  # noqa: BLE001 - one failing command must not hold its batch back until reclaim
            log.warning("a batch of %d failed; deciding its commands one by one", len(parsed), exc_info=True)
            if await self.decide_alone(stream, parsed):
                # The failed ones stay pending (their delivery count grows); the others were acknowledged.
                raise

    async def decide_commands(self, commands: list[SendMessage], acknowledge: Acknowledge | None = None) -> None:
        """Decide, make durable, answer, and then acknowledge ``acknowledge``'s entries, in the
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
            entries = acknowledge.entry_ids if acknowledge is not None else [None] * len(commands)
            await self.answer([Unanswered(*pair) for pair in zip(commands, entries)],
                              {c.command_id: answer for c in commands},
                              acknowledge.stream if acknowledge is not None else None)

    @property
    def step_deadline_s(self) -> float:
        # Past reclaim_idle_ms another worker may take the batch over anyway; never below a reply's own bound.
        return max(REPLY_TIMEOUT_S, self.config.reclaim_idle_ms / 1000)

    async def _decide_and_answer(self, commands: list[SendMessage], acknowledge: Acknowledge | None) -> None:
        started = time.perf_counter()
        spans = decisionspans.start(commands)
        outcomes, done = await self.decider.decide(commands, acknowledge)
        # The rest: commands whose append did not answer them (``SendService.decide``), and their entries.
        entries = acknowledge.entry_ids if acknowledge is not None else [None] * len(commands)
        rest = [Unanswered(command, entry) for command, entry in zip(commands, entries)
                if entry is None or entry not in done]
        if rest:
            await self.answer(rest, outcomes, acknowledge.stream if acknowledge is not None else None)
        self.decided += len(commands)
        record_batch(commands, outcomes, time.perf_counter() - started)
        decisionspans.end(spans, commands, outcomes)

    async def answer(self, rest: list[Unanswered], outcomes: dict[str, dict], stream: str | None) -> None:
        """Answer ``rest`` and then acknowledge their entries of ``stream``."""
        answers: dict[str, list[str]] = {}
        for command, _ in rest:
            answer = encode_answer(command.command_id, outcomes[command.command_id])
            answers.setdefault(command.reply_to, []).append(answer)
        entry_ids = [entry for _, entry in rest if entry is not None]
        # One server: answers and acknowledgement in one transaction (a refused answer leaves the batch
        # pending). A cluster spreads them over nodes with no order between them: acknowledge after.
        together = stream is not None and not self.config.cluster
        async with self.redis.pipeline(transaction=together) as pipe:
            for reply_to, values in answers.items():
                pipe.lpush(keys.reply_list(reply_to), *values)
                pipe.expire(keys.reply_list(reply_to), keys.REPLY_TTL_S)
            if together:
                pipe.xack(stream, keys.COMMAND_GROUP, *entry_ids)
            await pipe.execute()
        if stream is not None and not together:
            await self.redis.xack(stream, keys.COMMAND_GROUP, *entry_ids)

    async def decide_reclaimed(self, stream: str, entries: list) -> int:
        """Decide entries taken over or left pending (``reclaim``, a stream given up): one delivered more than
        ``max_deliveries`` times is poison, set aside with its producer told. Returns how many it handled."""
        ids = [entry_id for entry_id, _ in entries]
        pending = await self.redis.xpending_range(
            stream, keys.COMMAND_GROUP, min=ids[0], max=ids[-1], count=len(ids) * 2, consumername=self.consumer
        )
        deliveries = {p["message_id"]: p["times_delivered"] for p in pending}
        limit = self.config.max_deliveries
        parsed, unreadable = split_malformed(entries)
        fields_of = dict(entries)
        poison = [
            Letter(i, fields_of[i], "max_deliveries", answer=(command.reply_to, {
                "command_id": command.command_id, **gave_up(limit)}))
            for i, command in parsed if deliveries.get(i, 0) > limit
        ]
        good = [(i, command) for i, command in parsed if deliveries.get(i, 0) <= limit]
        if unreadable or poison:
            await self.dead_letter(stream, unreadable + poison)
        if not good:
            return len(entries)
        try:
            await self.decide_commands([command for _, command in good],
                                       Acknowledge(stream, [entry_id for entry_id, _ in good]))
        except Exception:  # noqa: BLE001 - isolate the command that fails; the others go through
            log.warning("a reclaimed batch failed; deciding its commands one by one", exc_info=True)
            await self.decide_alone(stream, good)
        return len(entries)

    async def decide_alone(self, stream: str, commands: list[tuple]) -> int:
        """Decide and acknowledge each command by itself; returns how many failed (they stay pending)."""
        failed = 0
        for entry_id, command in commands:
            try:
                await self.decide_commands([command], Acknowledge(stream, [entry_id]))
            except Exception:  # noqa: BLE001 - stays pending; its delivery count grows
                failed += 1
                log.warning("command %s failed", text(entry_id), exc_info=True)
        return failed

    async def dead_letter(self, stream: str, letters: list[Letter]) -> None:
        await dead_letter(self.redis, stream, letters, self.consumer)
