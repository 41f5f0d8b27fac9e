"""Connecting to Redis/Valkey: bounded retries with a clear error, never a wall of tracebacks."""

import redis.asyncio as aioredis
from redis.asyncio.cluster import RedisCluster
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import RedisClusterException
from redis.exceptions import TimeoutError as RedisTimeoutError
from tenacity import AsyncRetrying, retry_if_exception_type, stop_after_attempt, wait_exponential

from .config import ServiceConfig
from ..domain.errors import RedisUnavailable


async def connect(url: str, config: ServiceConfig) -> aioredis.Redis:
    if config.cluster:
        client = RedisCluster.from_url(url, socket_connect_timeout=2, max_connections=1000)
    else:
        # A blocking pool: a burst of concurrent sends waits for a connection instead of failing.
        pool = aioredis.BlockingConnectionPool.from_url(
            url, max_connections=64, timeout=None, socket_connect_timeout=2, health_check_interval=30
        )
        client = aioredis.Redis(connection_pool=pool)
    try:
        async for attempt in AsyncRetrying(
            stop=stop_after_attempt(config.connect_attempts),
            wait=wait_exponential(multiplier=0.1, max=2),
            retry=retry_if_exception_type((RedisConnectionError, RedisTimeoutError, RedisClusterException, OSError)),
            reraise=True,
        ):
            with attempt:
                await client.ping()
    except (RedisConnectionError, RedisTimeoutError, RedisClusterException, OSError) as exc:
        await client.aclose()
        raise RedisUnavailable(
            f"cannot reach Redis/Valkey at {url} after {config.connect_attempts} attempts: {exc}. "
            "Start the server, or unset REDIS_URL to let treemail start an embedded Valkey."
        ) from None
    return client


async def require_durable_server(client, cluster: bool = False) -> None:
    """The durable profile answers only after fsync, which needs the append-only file.

    On one server WAITAOF confirms each append's fsync. A cluster pipeline
    writes to several nodes over several connections, so there every primary
    must fsync each write itself: appendfsync always.
    """
    if not cluster:
        appendonly = (await client.config_get("appendonly")).get("appendonly")
        if appendonly not in ("yes", b"yes"):
            raise RedisUnavailable(
                "profile = \"durable\" needs a server with appendonly yes (WAITAOF confirms the fsync); "
                "enable AOF or use profile = \"fast\""
            )
        return
    for node in client.get_primaries():
        settings = await client.config_get("append*", target_nodes=node)
        if _text(settings.get("appendonly")) != "yes" or _text(settings.get("appendfsync")) != "always":
            raise RedisUnavailable(
                f"profile = \"durable\" on a cluster needs appendonly yes and appendfsync always on every "
                f"primary; {node.host}:{node.port} has appendonly {_text(settings.get('appendonly'))}, "
                f"appendfsync {_text(settings.get('appendfsync'))}"
            )


def _text(value) -> str | None:
    return value.decode() if isinstance(value, bytes) else value
