"""What every `treemail` subcommand shares: the common options, configuration, a connected host.

A command gets the host API (``Treemail``) and, for what it reads below the
host API (views, streams, dead letters, handles), the server's own adapters
(``Server``), each on its own connection.
"""

import asyncio
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Optional

import typer

from treemail.adapters.config import load_config
from treemail.domain.errors import ConfigError, UnknownSessionError

ConfigOpt = Annotated[Optional[Path], typer.Option(
    "--config", help="TOML file with [messaging] and [service] tables (default: TREEMAIL_CONFIG); "
    "accepted before or after the subcommand", show_default=False)]
JsonOpt = Annotated[bool, typer.Option("--json", help="one JSON object per line, for scripts")]
SessionArg = Annotated[str, typer.Argument(
    metavar="SESSION", help="a session id, or a handle such as explore_1a2b3c4d (unique per tree)")]


def config_of(ctx: typer.Context, config: Path | None):
    return load_config(config or (ctx.obj or {}).get("config"))


def url_of(config) -> str:
    url = config.service.redis_url
    if not url:
        raise ConfigError("no server: set REDIS_URL (or [service] redis_url in TREEMAIL_CONFIG); `treemail server` "
                          "starts a local Valkey and prints the URL")
    return url


@dataclass(frozen=True)
class Server:
    """The server's adapters, built from the configured URL."""

    config: object
    redis: object
    store: object

    async def record(self, session_id: str):
        record = await self.store.directory.get(session_id)
        if record is None:
            raise UnknownSessionError(f"no session has id {session_id}")
        return record


async def with_host(config, action):
    """``action(host, server)``: the host API and the server's adapters, both closed afterwards."""
    from treemail.adapters.connection import connect
    from treemail.adapters.eventstore import EventStore
    from treemail.host import Treemail

    host = await Treemail.connect(config, url_of(config))
    try:
        redis = await connect(url_of(config), config.service)
        try:
            return await action(host, Server(config, redis, EventStore(redis, config.service)))
        finally:
            await redis.aclose()
    finally:
        await host.close()


def run_with_host(ctx, config, action):
    return asyncio.run(with_host(config_of(ctx, config), action))


async def session_id(server: Server, ref: str) -> str:
    """A session id as given, or the one session a handle names in any tree."""
    from treemail.adapters.handles import sessions_with_handle
    from treemail.domain import limits
    from treemail.domain.ids import is_uuid

    # What a person typed is refused before it is looked up: too long, or not text (a byte that is not UTF-8
    # reaches Python as a lone surrogate).
    limits.require_id("session", ref)
    if is_uuid(ref):
        return ref
    found = await sessions_with_handle(server.redis, server.config.service.partitions, ref)
    if not found:
        raise UnknownSessionError(f"no session has id or handle {ref!r}")
    if len(found) > 1:
        raise UnknownSessionError(f"handle {ref!r} names {len(found)} sessions in different trees "
                                  f"({', '.join(found)}): give the session id")
    return found[0]
