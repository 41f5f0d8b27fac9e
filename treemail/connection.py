"""Connecting to Redis/Valkey: bounded retries with a clear error, never a wall of tracebacks."""

import redis.asyncio as aioredis
from redis.exceptions import ConnectionError as RedisConnectionError, TimeoutError as RedisTimeoutError
from tenacity import AsyncRetrying, retry_if_exception_type, stop_after_attempt, wait_exponential

from .config import ServiceConfig
from .errors import RedisUnavailable


async def connect(url: str, config: ServiceConfig) -> aioredis.Redis:
    # A blocking pool: a burst of concurrent sends waits for a connection instead of failing.
    pool = aioredis.BlockingConnectionPool.from_url(
        url, max_connections=64, timeout=None, socket_connect_timeout=2, health_check_interval=30
    )
    client = aioredis.Redis(connection_pool=pool)
    try:
        async for attempt in AsyncRetrying(
            stop=stop_after_attempt(config.connect_attempts),
            wait=wait_exponential(multiplier=0.1, max=2),
            retry=retry_if_exception_type((RedisConnectionError, RedisTimeoutError, OSError)),
            reraise=True,
        ):
            with attempt:
                await client.ping()
    except (RedisConnectionError, RedisTimeoutError, OSError) as exc:
        await client.aclose()
        raise RedisUnavailable(
            f"cannot reach Redis/Valkey at {url} after {config.connect_attempts} attempts: {exc}. "
            "Start the server, or unset REDIS_URL to let treemail start an embedded Valkey."
        ) from None
    return client


async def require_durable_server(client: aioredis.Redis) -> None:
    """The durable profile answers only after fsync, which needs the append-only file."""
    appendonly = (await client.config_get("appendonly")).get("appendonly")
    if appendonly not in ("yes", b"yes"):
        raise RedisUnavailable(
            "profile = \"durable\" needs a server with appendonly yes (WAITAOF confirms the fsync); "
            "enable AOF or use profile = \"fast\""
        )
