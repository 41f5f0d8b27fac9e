"""Connecting to Redis/Valkey: bounded retries with a clear error, never a wall of tracebacks.

Whatever reaches a log line or an error message names the server by
``redact(url)``: a password in the URL never leaves this process.
"""

import re
from urllib.parse import parse_qsl, urlsplit

import redis.asyncio as aioredis
from redis.asyncio.cluster import RedisCluster
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import NoPermissionError, RedisClusterException, ResponseError
from redis.exceptions import TimeoutError as RedisTimeoutError
from tenacity import AsyncRetrying, retry_if_exception_type, stop_after_attempt, wait_exponential

from .config import ServiceConfig
from ..domain.errors import RedisUnavailable

HIDDEN = "***"


def redact(url: str) -> str:
    """The URL with any password (``user:secret@``, ``?password=``) replaced by ``***``."""
    try:
        parts = urlsplit(url)
    except ValueError:
        # Not even a URL: say nothing of it rather than risk echoing a secret.
        return "<unparsable URL>"
    if parts.password is not None:
        credentials, _, host = parts.netloc.rpartition("@")
        user = credentials.split(":", 1)[0]
        url = url.replace(parts.netloc, f"{user}:{HIDDEN}@{host}", 1)
    return _PASSWORD_PARAM.sub(rf"\1{HIDDEN}", url)


_PASSWORD_PARAM = re.compile(r"([?&]password=)[^&#]*", re.IGNORECASE)


def _secrets(url: str) -> list[str]:
    try:
        parts = urlsplit(url)
        found = [parts.password] if parts.password else []
        found += [v for k, v in parse_qsl(parts.query) if k.lower() == "password" and v]
        return found
    except ValueError:
        return []


def scrub(text: str, url: str) -> str:
    """``text`` with every secret of ``url`` removed (a client library may quote the URL back)."""
    for secret in _secrets(url):
        text = text.replace(secret, HIDDEN)
    return text


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
        raise RedisUnavailable(scrub(
            f"cannot reach Redis/Valkey at {redact(url)} after {config.connect_attempts} attempts: {exc}. "
            "Start the server, or unset REDIS_URL to let treemail start an embedded Valkey.", url
        )) from None
    return client


async def require_durable_server(client, cluster: bool = False) -> None:
    """The durable profile answers only after fsync, which needs the append-only file.

    On one server WAITAOF confirms each append's fsync, so WAITAOF itself is
    the check: it refuses at once when appendonly is off, and it needs no
    CONFIG rights (an ACL user limited to treemail's keys may run it). A
    cluster pipeline writes to several nodes over several connections, so
    there every primary must fsync each write itself (appendfsync always),
    which only CONFIG GET can show.
    """
    if not cluster:
        try:
            await client.execute_command("WAITAOF", 1, 0, 1000)
        except NoPermissionError:
            raise RedisUnavailable(
                "profile = \"durable\" needs the WAITAOF command; this user may not run it "
                "(grant it, e.g. ACL SETUSER <user> +waitaof)"
            ) from None
        except ResponseError as exc:
            if "appendonly" not in str(exc):
                raise
            raise RedisUnavailable(
                "profile = \"durable\" needs a server with appendonly yes (WAITAOF confirms the fsync); "
                "enable AOF or use profile = \"fast\""
            ) from None
        return
    for node in client.get_primaries():
        try:
            settings = await client.config_get("append*", target_nodes=node)
        except NoPermissionError:
            raise RedisUnavailable(
                "profile = \"durable\" on a cluster checks appendonly yes and appendfsync always on every "
                "primary with CONFIG GET, which this user may not run: grant it (ACL SETUSER <user> "
                "+config|get) or use profile = \"fast\""
            ) from None
        if _text(settings.get("appendonly")) != "yes" or _text(settings.get("appendfsync")) != "always":
            raise RedisUnavailable(
                f"profile = \"durable\" on a cluster needs appendonly yes and appendfsync always on every "
                f"primary; {node.host}:{node.port} has appendonly {_text(settings.get('appendonly'))}, "
                f"appendfsync {_text(settings.get('appendfsync'))}"
            )


def _text(value) -> str | None:
    return value.decode() if isinstance(value, bytes) else value
