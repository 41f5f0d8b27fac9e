import asyncio
import contextlib
import itertools
from dataclasses import dataclass

import pytest
import redis.asyncio as aioredis

from treemail.consumers.app import Worker
from treemail.adapters.config import Config, MessagingConfig, ServiceConfig
from treemail.adapters.connection import connect
from treemail.adapters.eventstore import EventStore
from treemail.host import SendContext, Treemail
from treemail.services.sessions import SessionService

from ..conftest import CLUSTER, backend_env

_db = itertools.count(1)
# A killed worker's command streams go to the others after this long (``worker_timeout_ms``), as its
# pending commands do after reclaim_idle_ms (500 ms here).
WORKER_TIMEOUT_MS = 2000


# For a test that sends thousands at once: how long a host waits for each decision, far from what a
# loaded machine needs to decide them all (the outcome is asserted, never the pace).
LOADED_DECISION_TIMEOUT_S = 180.0


def make_config(url: str, profile: str = "fast", decision_timeout_s: float = 10, **messaging) -> Config:
    return Config(
        messaging=MessagingConfig(**messaging),
        service=ServiceConfig(
            redis_url=url, command_streams=2, reclaim_idle_ms=500, worker_timeout_ms=WORKER_TIMEOUT_MS,
            decision_timeout_s=decision_timeout_s, profile=profile, cluster=CLUSTER,
        ),
    )


@pytest.fixture
async def redis_url(valkey):
    """A clean database for each test: no test sees another's streams. SYNC: Valkey frees a plain
    FLUSHALL's keys in a background thread, which would still be busy as the next test starts."""
    if CLUSTER:
        from redis.asyncio.cluster import RedisCluster

        client = RedisCluster.from_url(valkey.url)
        await client.execute_command("FLUSHALL", "SYNC", target_nodes=RedisCluster.PRIMARIES)
    else:
        client = aioredis.Redis.from_url(valkey.url)
        await client.execute_command("FLUSHALL", "SYNC")
    await client.aclose()
    return valkey.url


@dataclass(frozen=True)
class Server:
    """The server's adapters, built by a test from the Redis URL: what a test reads or writes below the host API."""

    config: Config
    redis: aioredis.Redis
    store: EventStore
    sessions: SessionService


@contextlib.asynccontextmanager
async def server_of(url: str, config: Config | None = None):
    config = config or make_config(url)
    redis = await connect(url, config.service)
    store = EventStore(redis, config.service)
    try:
        yield Server(config, redis, store, SessionService(store, config))
    finally:
        await redis.aclose()


# The adapters each running stack's test reads the server through, by the host they were built beside.
_SERVERS: dict[int, Server] = {}


def adapters(host: Treemail) -> Server:
    """The adapters built from the same URL and configuration as ``host`` (``running_stack``, ``connect_host``)."""
    return _SERVERS[id(host)]


async def connect_host(config: Config, url: str) -> Treemail:
    """``Treemail.connect`` with the adapters ``adapters(host)`` gives beside it; close with ``close_host``."""
    host = await Treemail.connect(config, url)
    redis = await connect(url, config.service)
    store = EventStore(redis, config.service)
    _SERVERS[id(host)] = Server(config, redis, store, SessionService(store, config))
    return host


async def close_host(host: Treemail) -> None:
    server = _SERVERS.pop(id(host), None)
    await host.close()
    if server is not None:
        await server.redis.aclose()


@contextlib.asynccontextmanager
async def running_stack(url: str, workers: int = 1, profile: str = "fast", config: Config | None = None,
                        **messaging):
    """Worker(s) and a host on ``url``; ``config`` replaces the one ``make_config`` builds."""
    config = config or make_config(url, profile, **messaging)
    pool = [Worker(config, url, consumer=f"test-worker-{i}") for i in range(workers)]
    for worker in pool:
        await worker.start()
    host = await Treemail.connect(config, url)
    try:
        async with server_of(url, config) as server:
            _SERVERS[id(host)] = server
            try:
                yield host
            finally:
                del _SERVERS[id(host)]
    finally:
        await host.close()
        for worker in pool:
            await worker.stop()


@contextlib.asynccontextmanager
async def timed_stack(url: str, **messaging):
    """``treemail.testing.TestStack`` on the tests' server (one Valkey or the cluster): a worker, a host and a
    pump on one clock that moves only at ``env.advance``; ``adapters(env.tm)`` beside it."""
    from treemail.testing import TestStack

    config = make_config(url, **messaging)
    async with TestStack.start(config=config, url=url) as env:
        async with server_of(url, config) as server:
            _SERVERS[id(env.tm)] = server
            try:
                yield env
            finally:
                del _SERVERS[id(env.tm)]


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


WORKER_ENV = {
    "TREEMAIL_METRICS_PORT": "-1",
    "TREEMAIL_SERVICE_COMMAND_STREAMS": "2",
    "TREEMAIL_SERVICE_RECLAIM_IDLE_MS": "500",
    "TREEMAIL_SERVICE_WORKER_TIMEOUT_MS": str(WORKER_TIMEOUT_MS),
}


def messaging_env(**messaging) -> dict[str, str]:
    return {f"TREEMAIL_MESSAGING_{k.upper()}": str(v).lower() if isinstance(v, bool) else str(v)
            for k, v in messaging.items()}


async def wait_for_workers(url: str, count: int, timeout: float = 20.0) -> None:
    """Until ``count`` live workers are in the members set: each reads its share of the command streams
    from its first heartbeat on (``consumers/ownership.py``)."""
    import time

    from treemail.adapters import members

    if CLUSTER:
        from redis.asyncio.cluster import RedisCluster

        client = RedisCluster.from_url(url)
    else:
        client = aioredis.Redis.from_url(url)
    deadline = time.monotonic() + timeout
    try:
        while True:
            live = len(await members.live(client, WORKER_TIMEOUT_MS))
            if live >= count:
                return
            if time.monotonic() > deadline:
                raise TimeoutError(f"only {live} of {count} workers came up")
            await asyncio.sleep(0.05)
    finally:
        await client.aclose()


@contextlib.asynccontextmanager
async def worker_processes(url: str, count: int, **messaging):
    """Real `treemail worker` processes, as operators run them."""
    import os
    import subprocess
    import sys

    env = {**os.environ, "REDIS_URL": url, **WORKER_ENV, **backend_env(), **messaging_env(**messaging)}
    pool = [
        subprocess.Popen([sys.executable, "-m", "treemail", "worker"], env=env, start_new_session=True)
        for _ in range(count)
    ]
    try:
        await wait_for_workers(url, count)
        yield pool
    finally:
        for process in pool:
            if process.poll() is None:
                process.terminate()
        for process in pool:
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


async def live(host, *sessions, run_id: str = "run-1") -> None:
    """Open a run on each session: only a session's open run may send (exact live sender)."""
    for session in sessions:
        await host.start_run(session.session_id, run_id)


@pytest.fixture(scope="module")
def exporter():
    """Spans kept in memory for a module's tests. The process's tracer provider can be set once: whichever
    module sets it, every later module's exporter joins it."""
    from opentelemetry import trace
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from treemail.adapters import tracing

    memory = InMemorySpanExporter()
    if not tracing.enabled():
        provider = TracerProvider()
        provider.add_span_processor(SimpleSpanProcessor(memory))
        trace.set_tracer_provider(provider)
    else:
        trace.get_tracer_provider().add_span_processor(SimpleSpanProcessor(memory))
    return memory


async def one_send(config: Config, url: str) -> dict:
    """A planner's send to its new child through a host of its own: what a freshly started stack answers."""
    host = await Treemail.connect(config, url)
    try:
        root = await host.register_root("planner", "x", rules={"child": "allow"})
        child = await host.register_child(root.session_id, "explore", "x")
        await host.start_run(root.session_id, "r")
        return await host.send_message(SendContext(root.session_id, "r", "c"), {"to": child.handle, "body": "hi"})
    finally:
        await host.close()


@contextlib.asynccontextmanager
async def serving(app):
    """``app`` served by uvicorn in this test's event loop on a free loopback port; yields the base URL."""
    import uvicorn

    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning"))
    task = asyncio.create_task(server.serve())
    while not server.started:
        if task.done():
            task.result()
        await asyncio.sleep(0.02)
    try:
        yield f"http://127.0.0.1:{server.servers[0].sockets[0].getsockname()[1]}"
    finally:
        server.should_exit = True
        await task
