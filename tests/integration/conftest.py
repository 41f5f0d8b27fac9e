import asyncio
import contextlib
import itertools

import pytest
import redis.asyncio as aioredis

from consumers.app import Worker
from treemail.config import Config, MessagingConfig, ServiceConfig
from treemail.host import SendContext, Treemail

_db = itertools.count(1)


def make_config(url: str, **messaging) -> Config:
    return Config(
        messaging=MessagingConfig(**messaging),
        service=ServiceConfig(redis_url=url, command_streams=2, reclaim_idle_ms=500, decision_timeout_s=10),
    )


@pytest.fixture
async def redis_url(valkey):
    """A clean database for each test: no test sees another's streams."""
    client = aioredis.Redis.from_url(valkey.url)
    await client.flushall()
    await client.aclose()
    return valkey.url


@contextlib.asynccontextmanager
async def running_stack(url: str, workers: int = 1, **messaging):
    config = make_config(url, **messaging)
    pool = [Worker(config, url, consumer=f"test-worker-{i}") for i in range(workers)]
    for worker in pool:
        await worker.start()
    host = await Treemail.connect(config, url)
    try:
        yield host
    finally:
        await host.close()
        for worker in pool:
            await worker.stop()


@pytest.fixture
async def stack(redis_url):
    async with running_stack(redis_url) as host:
        yield host


class Calls:
    """Fresh run and tool-call ids, as a host would give them."""

    def __init__(self) -> None:
        self.counter = itertools.count()

    def ctx(self, session_id: str, run_id: str = "run-1") -> SendContext:
        return SendContext(session_id, run_id, f"call-{next(self.counter)}")


@pytest.fixture
def calls() -> Calls:
    return Calls()
