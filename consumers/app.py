"""The worker process: a FastStream Redis broker with batch subscribers on the command streams.

Each worker reads batches with XREADGROUP from every command stream in one
consumer group, decides them (consumers.sends), answers each producer, and
only then lets FastStream XACK the batch. A second subscriber per stream
XAUTOCLAIMs commands left pending by a dead worker for ``reclaim_idle_ms``
and decides them again; idempotency makes that second decision return the
first one's result.
"""

import asyncio
import json
import logging
import os
import signal
import socket

from faststream.redis import RedisBroker, StreamSub
from faststream.redis.annotations import RedisBatchStreamMessage

from treemail import keys
from treemail.config import Config
from treemail.connection import connect, require_durable_server

from .approvals import ApprovalStore
from .eventstore import EventStore
from .sends import SendDecider, parse_command

log = logging.getLogger("treemail.worker")
REPLY_TTL_S = 120


class Worker:
    def __init__(self, config: Config, url: str, consumer: str | None = None) -> None:
        self.config = config
        self.url = url
        self.consumer = consumer or f"{socket.gethostname()}-{os.getpid()}"
        self.broker = RedisBroker(url, logger=None, graceful_timeout=30)
        self.decider: SendDecider | None = None
        self.redis = None
        self.decided = 0
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
        # Returning lets FastStream XACK the whole batch: every decision above is durable.

    async def start(self) -> None:
        self.redis = await connect(self.url, self.config.service)
        if self.config.service.profile == "durable":
            await require_durable_server(self.redis)
        store = EventStore(self.redis, self.config.service)
        await store.ensure_command_group(self.config.service.command_streams)
        await store.load_scripts()
        self.decider = SendDecider(store, ApprovalStore(store), self.config.messaging)
        await self.broker.start()

    async def stop(self) -> None:
        """Finish the batch in hand, take no new commands, close."""
        await self.broker.stop()
        if self.redis is not None:
            await self.redis.aclose()


async def serve(config: Config, url: str) -> None:
    worker = Worker(config, url)
    stopping = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stopping.set)
    await worker.start()
    log.info("worker %s deciding commands on %s", worker.consumer, url)
    await stopping.wait()
    await worker.stop()
