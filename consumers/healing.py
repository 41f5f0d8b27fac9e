"""Healing a server that came back without its data: the command group recreated, stopped subscribers
restarted. The health probe and the reclaim pass both heal; one at a time, so a loss is mended and logged
once."""

import asyncio
import logging

from redis.exceptions import ResponseError as RedisResponseError

from treemail.adapters import keys
from treemail.adapters.config import ServiceConfig
from treemail.adapters.eventstore import EventStore

from .commandsubscribers import CommandSubscribers
from .entries import text

log = logging.getLogger("treemail.worker")


class Healing:
    def __init__(self, config: ServiceConfig, redis, store: EventStore, subscribers: CommandSubscribers) -> None:
        self.config = config
        self.redis = redis
        self.store = store
        self.subscribers = subscribers
        self._lock = asyncio.Lock()

    async def heal(self) -> int:
        """Recreate a lost command group and restart the subscribers FastStream stopped on its loss.

        A server back without its data (no AOF, a flush) has no consumer group: whichever meets it first,
        this probe or a subscriber's read (NOGROUP, which stops it for good), the worker reads again and
        says so in one log line. Returns how many streams or subscribers it mended.
        """
        async with self._lock:
            lost = await self.streams_without_group()
            if lost:
                await self.ensure_group()
            restarted = await self.subscribers.revive(self.ensure_group)
        if lost or restarted:
            log.warning("the server had lost the command streams' consumer group: recreated it on %d stream(s) "
                        "and restarted %d stopped subscriber(s); reading commands again", len(lost), restarted)
        return len(lost) + restarted

    async def ensure_group(self) -> None:
        await self.store.ensure_command_group(self.config.command_streams)

    async def streams_without_group(self) -> list[str]:
        missing = []
        for index in range(self.config.command_streams):
            stream = keys.command_stream(index)
            try:
                groups = await self.redis.xinfo_groups(stream)
            except RedisResponseError:  # no such key: the stream is gone with the server's data
                groups = []
            if not any(text(g["name"]) == keys.COMMAND_GROUP for g in groups):
                missing.append(stream)
        return missing
