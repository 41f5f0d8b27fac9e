"""Connecting to Redis/Valkey: bounded retries with a clear error, never a wall of tracebacks.

Whatever reaches a log line or an error message names the server by
``redact(url)``: a password in the URL never leaves this process.
"""

import re
from functools import cache
from urllib.parse import parse_qsl, urlsplit

import redis.asyncio as aioredis
from redis.asyncio.cluster import RedisCluster
from redis.connection import HIREDIS_AVAILABLE, HiredisRespSerializer
from redis.exceptions import AuthenticationError, AuthorizationError
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import NoPermissionError, RedisClusterException, ResponseError
from redis.exceptions import TimeoutError as RedisTimeoutError
from tenacity import (
    AsyncRetrying, retry_if_exception_type, retry_if_not_exception_type, stop_after_attempt, wait_exponential,
)

from .config import ServiceConfig
from ..domain.errors import ConfigError, RedisUnavailable

if HIREDIS_AVAILABLE:
    from hiredis import pack_command as hiredis_pack

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


class _HiredisPacking:
    """Packs commands with hiredis (C), as redis-py's synchronous client does; its asyncio client packs in
    Python, argument by argument. A commit is one EVALSHA with dozens of arguments (events, snapshot,
    mail items), and packing them in Python was a fifth of a worker's CPU (BENCHMARKS.md).
    Same bytes on the wire, same refusal of a value that is not str, bytes, int or float.

    Still paying, measured again: one worker deciding a 5,000-send backlog (``python -m bench.run --quick
    --only one``, five runs each way, alternated, on 2 shared cores at load 2.5-4.2) used 1.22 s of CPU with
    this packing against 1.48 s without (-18%); sends/s, median 1,461 against 1,191, too noisy to read
    further. It is a subclass of the connection class the URL chose, set on the client's pool (and a
    cluster's nodes); redis-py's own classes are left as they are."""

    _packer = HiredisRespSerializer()

    def pack_command(self, *args):
        name = args[0]
        if " " in name if isinstance(name, str) else b" " in name:
            return self._packer.pack(*args)  # a two-word command ("SCRIPT LOAD"): redis-py splits it
        try:
            # redis-py's serializer first walks every argument in Python to convert bytearrays and
            # memoryviews; treemail passes str, bytes and numbers, which hiredis takes as they are.
            return [hiredis_pack(args)]
        except TypeError:
            return self._packer.pack(*args)  # converted there, or refused as before


@cache
def fast_packing(connection_class: type) -> type:
    """``connection_class`` (plain, TLS or Unix socket, whichever the URL chose) packing with hiredis."""
    if not HIREDIS_AVAILABLE or issubclass(connection_class, _HiredisPacking):
        return connection_class
    return type(f"Hiredis{connection_class.__name__}", (_HiredisPacking, connection_class), {})


def _pack_with_hiredis(client) -> None:
    if isinstance(client, RedisCluster):
        # Nodes discovered later are built from these keyword arguments; the startup nodes exist already.
        kwargs = client.connection_kwargs
        kwargs["connection_class"] = fast_packing(kwargs.get("connection_class", aioredis.Connection))
        for node in client.nodes_manager.startup_nodes.values():
            node.connection_class = fast_packing(node.connection_class)
    else:
        pool = client.connection_pool
        pool.connection_class = fast_packing(pool.connection_class)


def url_refused(url: str, exc: Exception) -> ConfigError:
    """The error for a URL whose scheme, port or query option the client refused (redis-py raises ValueError
    or TypeError for them, the latter only once a connection is made)."""
    return ConfigError(scrub(f"REDIS_URL (or [service] redis_url) {redact(url)} is not a URL this client takes: "
                             f"{str(exc).rstrip('. ')}", url))


# redis-py's own default: a read that waits longer for the server fails.
REPLY_TIMEOUT_S = 5.0


async def connect(url: str, config: ServiceConfig, per_reply_timeout: bool = True) -> aioredis.Redis:
    """``per_reply_timeout=False``: no timer around each reply read; for a caller that bounds its own
    steps as a whole. A worker's pipeline reads hundreds of replies, and a timer armed and cancelled
    for each one of them was a tenth of its CPU (BENCHMARKS.md)."""
    timeout = REPLY_TIMEOUT_S if per_reply_timeout else None
    try:
        if config.cluster:
            client = RedisCluster.from_url(url, socket_connect_timeout=2, socket_timeout=timeout,
                                           max_connections=1000)
        else:
            # A blocking pool: a burst of concurrent sends waits for a connection instead of failing.
            pool = aioredis.BlockingConnectionPool.from_url(
                url, max_connections=64, timeout=None, socket_connect_timeout=2, socket_timeout=timeout,
                health_check_interval=30,
            )
            client = aioredis.Redis(connection_pool=pool)
    except (ValueError, TypeError) as exc:  # a scheme, port or option the client does not take
        raise url_refused(url, exc) from None
    _pack_with_hiredis(client)
    try:
        async for attempt in AsyncRetrying(
            stop=stop_after_attempt(config.connect_attempts),
            wait=wait_exponential(multiplier=0.1, max=2),
            # Wrong credentials are not a server still starting: asked again, they are refused again.
            retry=(retry_if_exception_type((RedisConnectionError, RedisTimeoutError, RedisClusterException, OSError))
                   & retry_if_not_exception_type((AuthenticationError, AuthorizationError))),
            reraise=True,
        ):
            with attempt:
                await client.ping()
    except (AuthenticationError, AuthorizationError) as exc:
        await client.aclose()
        raise ConfigError(scrub(f"Redis/Valkey at {redact(url)} refused the credentials: "
                                f"{str(exc).rstrip('. ')}; check the user and password in REDIS_URL", url)) from None
    except (ValueError, TypeError) as exc:  # an option of the URL's query that no connection takes
        await client.aclose()
        raise url_refused(url, exc) from None
    except (RedisConnectionError, RedisTimeoutError, RedisClusterException, OSError) as exc:
        await client.aclose()
        raise RedisUnavailable(scrub(
            f"cannot reach Redis/Valkey at {redact(url)} after {config.connect_attempts} attempts: "
            f"{str(exc).rstrip('. ')}. Start that server, or run `treemail server` for a local Valkey and set "
            "REDIS_URL to the URL it prints", url
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
