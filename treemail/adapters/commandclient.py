"""The command client: publish a SendMessage to a command stream and wait for its decision (or, with
``[service] host_decides_sends``, decide it here, as a worker would).

Each client owns a reply list; one background task pops it and hands each
answer to the send waiting for it. A send that gets no answer before its
deadline, or that is still waiting when the client closes, is answered with
send_message:engine_shutdown: the command may still be decided, and because
the idempotency key is the tool call, retrying that tool call is safe.
"""

import asyncio
import contextlib
import json
import logging
from collections.abc import Mapping
from typing import Any, Protocol

from redis.asyncio import Redis
from redis.exceptions import RedisError
from tenacity import AsyncRetrying, retry_if_exception_type, wait_fixed

from ..domain import compactjson, ids
from ..domain.commands import SendArguments, SendContext, SendMessage
from ..domain.results import engine_shutdown
from . import keys
from .codec import encode_command
from .config import ServiceConfig
from .directory import Directory
from .lanes import Lanes, raise_refused

log = logging.getLogger("treemail.client")
# At most this many commands in one publishing round trip; more wait for the next.
MAX_PUBLISH_BATCH = 500
# At most this many answers taken from the reply list in one round trip.
MAX_ANSWERS_PER_POP = 1000


def command_stream(config: ServiceConfig, route: str) -> str:
    """The command stream of the tree whose root is ``route`` (or of the sender ``route``, routed by sender)."""
    return keys.command_stream(keys.command_shard(route, config.command_streams))


class Decider(Protocol):
    """What decides a send in this process as a worker would (``services.sends.SendService``): handed in by
    the host's bootstrap, so this adapter never imports the services above it."""

    async def decide(self, commands: list[SendMessage]) -> tuple[Mapping[str, Any], Any]: ...


def _no_decision(answer: asyncio.Future, timeout_s: float) -> None:
    if not answer.done():
        answer.set_result(engine_shutdown(f"no decision within {timeout_s:g} s"))


class CommandClient:
    def __init__(self, redis: Redis, listener: Redis, config: ServiceConfig, directory: Directory | None = None,
                 decider: Decider | None = None) -> None:
        """``directory``: where a sender's tree is looked up (``stream_for``); without it, commands go by sender.
        ``decider``: decides each command in this process (``_decide_here``, ``[service] host_decides_sends``);
        None: the workers decide them all."""
        self._decider = decider
        self._listener = listener
        self.config = config
        self._directory = directory
        # Published on kept connections (``lanes``), not a pipeline borrowed for each round trip.
        self._lanes = Lanes(redis, cluster=config.cluster)
        # The listener's one connection, kept: a pop through the pool borrows and returns a connection
        # each time, which cost about a tenth of the host's CPU per send at one answer per pop.
        self._answers = Lanes(listener, kept=1, cluster=config.cluster)
        self.client_id = ids.uuid7()
        self._waiting: dict[str, asyncio.Future] = {}
        self._closing = False
        # Commands waiting to be published, each with the future its send awaits: concurrent sends go out
        # together, one round trip per turn of the event loop, instead of a connection, a write and a
        # round trip each (BENCHMARKS.md: a write per send was a fifth of a busy host's CPU; a cluster
        # client also refuses past its per-node connection limit instead of waiting).
        self._outbox: list[tuple[str, bytes, asyncio.Future]] = []
        self._flushing: asyncio.Task | None = None
        self._task = asyncio.create_task(self._listen())

    @property
    def closing(self) -> bool:
        return self._closing

    def stream_for(self, context: SendContext, root_session_id: str | None = None) -> str:
        """The command stream of the sender's tree, named by its root (the sender's own id without one).

        One tree's commands always use one stream, and each stream is one live worker's
        (``consumers/ownership.py``): a child's report to its parent and the parent's next send are decided
        by one worker, which would otherwise conflict with another on the sessions both touch. A sender is
        in one tree for good, so its commands stay on one stream and are decided in order.
        """
        return command_stream(self.config, root_session_id or context.session_id)

    async def _tree_of(self, context: SendContext) -> str | None:
        """The sender's tree root when commands go by tree (``route_commands_by``); None routes by sender."""
        if self._directory is None or self.config.command_streams == 1 or self.config.route_commands_by == "sender":
            return None
        record = await self._directory.get(context.session_id)  # cached: a record never changes
        return record.root_session_id if record is not None else None

    async def request(self, context: SendContext, arguments: SendArguments, traceparent: str = "") -> dict:
        if self._closing:
            return engine_shutdown("the engine is shutting down")
        command = SendMessage(ids.uuid7(), context, arguments, self.client_id, traceparent)
        if self._decider is not None and not traceparent:
            decided = await self._decide_here(command)
            if decided is not None:
                return decided
        loop = asyncio.get_running_loop()
        # One future per send, answered by its decision, by its failed publishing or at its deadline: the
        # send wakes once. A future for the publishing and a wait_for around the answer woke it twice: a
        # sixth of the host's own Python per send (56 us against 47 us, measured with no I/O).
        answer = loop.create_future()
        self._waiting[command.command_id] = answer
        deadline = loop.call_later(self.config.decision_timeout_s, _no_decision, answer,
                                   self.config.decision_timeout_s)
        try:
            stream = self.stream_for(context, await self._tree_of(context))
            self._outbox.append((stream, encode_command(command), answer))
            if self._flushing is None:
                self._flushing = asyncio.create_task(self._flush())
            return await answer
        except RedisError as exc:
            return engine_shutdown(f"the message service is unreachable ({type(exc).__name__})")
        finally:
            deadline.cancel()
            self._waiting.pop(command.command_id, None)

    async def _decide_here(self, command: SendMessage) -> dict | None:
        """``command`` decided in this process, by the decision and the commit script a worker runs, under the
        same etags, idempotency record and live-sender check: its answer costs no trip through the command
        stream, a worker and the reply list. None: it failed part way (a lost connection, say) and goes to the
        workers, whose decision of it is this one's if this one was appended (the tool call's key)."""
        try:
            outcomes, _ = await self._decider.decide([command])
            # As the worker's answer reads once decoded: the same JSON, whoever decided it.
            return json.loads(compactjson.dumps(outcomes[command.command_id]))
        except Exception:  # noqa: BLE001 - the workers decide it instead, idempotently
            log.debug("a send decided here failed; it goes to the workers", exc_info=True)
            return None

    async def _flush(self) -> None:
        """Publishes the outbox, a batch a round trip; a send whose command could not be published is answered
        with what its round trip raised (its decision answers the others)."""
        try:
            while self._outbox:
                batch, self._outbox = self._outbox[:MAX_PUBLISH_BATCH], self._outbox[MAX_PUBLISH_BATCH:]
                try:
                    replies = await self._lanes.run([("XADD", stream, "*", "__data__", data)
                                                     for stream, data, _ in batch])
                except Exception as exc:  # noqa: BLE001 - every send of the batch is answered with it
                    replies = [exc] * len(batch)
                for (_, _, answer), reply in zip(batch, replies):
                    if isinstance(reply, BaseException) and not answer.done():  # done: answered or cancelled
                        answer.set_exception(reply)
        finally:
            self._flushing = None

    async def _listen(self) -> None:
        """Until the client closes. A dropped connection (any error) is retried after 0.2 s: a send
        waiting meanwhile is covered by its deadline. Cancellation is not an error and ends it."""
        reply_key = keys.reply_list(self.client_id)
        async for attempt in AsyncRetrying(
            retry=retry_if_exception_type(Exception), wait=wait_fixed(0.2),
            stop=lambda _: self._closing, retry_error_callback=lambda _: None,
        ):
            with attempt:
                while not self._closing:
                    await self._take_answers(reply_key)

    async def _take_answers(self, reply_key: str) -> None:
        """Waits up to a second for answers and hands each to its send. Answers arrive in bursts (a
        worker answers a whole batch): BLMPOP takes a burst in the round trip that waited for it."""
        if not self.config.cluster:
            popped = await self._pop_answers(reply_key)
            for raw in popped[1] if popped else ():
                self._deliver(raw)
            return
        # A cluster client asks a node where BLMPOP's keys are (they follow a count) before every call:
        # a round trip more. There, BLPOP waits for the first answer, which is handed over before the
        # rest of the burst is asked for.
        first = await self._listener.blpop([reply_key], timeout=1)
        if first is None:
            return
        self._deliver(first[1])
        for raw in await self._listener.lpop(reply_key, MAX_ANSWERS_PER_POP) or ():
            self._deliver(raw)

    async def _pop_answers(self, reply_key: str):
        """One BLMPOP of up to MAX_ANSWERS_PER_POP answers (waiting up to a second), on the kept connection."""
        command = ("BLMPOP", 1, 1, reply_key, "LEFT", "COUNT", MAX_ANSWERS_PER_POP)
        [popped] = raise_refused(await self._answers.run([command]))
        return popped

    def _deliver(self, raw: bytes) -> None:
        """Hand one answer to its send. Anything else in the list is skipped: the listener must outlive it.

        Whoever can write to the server can write here (see the docs' trust
        boundary); a stray entry must not stop the answers behind it.
        """
        try:
            answer = json.loads(raw)
            command_id = answer.pop("command_id")
            future = self._waiting.get(command_id)
        except (ValueError, TypeError, KeyError, AttributeError):
            log.warning("skipped an unreadable entry in reply list %s", keys.reply_list(self.client_id))
            return
        if future is not None and not future.done():
            future.set_result(answer)

    async def close(self) -> None:
        self._closing = True
        for future in self._waiting.values():
            if not future.done():
                future.set_result(engine_shutdown("the engine is shutting down"))
        self._task.cancel()
        # Closing never raises: whatever ended the listener, the sends were answered above.
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await self._task
