"""Subcommands for using treemail from any agent: `mcp`, `mcp-token`, `tool-schema`, `asyncapi`.

``register(app)`` adds them to the `treemail` command; each only wires a
function of the producers or consumers floor.
"""

import asyncio
import enum
import json
import sys
from typing import Annotated, Optional

import typer

from treemail.producers.host.tools import MAX_TOKEN_TTL_S

from .clicommon import ConfigOpt, SessionArg, config_of, run_with_host, session_id, url_of, with_host
from .httpserve import listen


class ToolFormat(str, enum.Enum):
    anthropic = "anthropic"
    openai = "openai"
    mcp = "mcp"


def mcp(
    ctx: typer.Context,
    session: Annotated[Optional[str], typer.Option(help="stdio: the agent session this server acts for (id or handle)")] = None,
    run: Annotated[Optional[str], typer.Option(
        help="stdio: the run it acts for (default: the session's open run at each call)")] = None,
    http: Annotated[bool, typer.Option(
        "--http", help="streamable HTTP on /mcp instead of stdio; each request needs a bearer token")] = False,
    receive: Annotated[bool, typer.Option(
        "--receive", help="the agent receives mail (check_mail, wait_for_mail, the inbox resource): over stdio the "
                          "connection is the agent, its session runs while it is connected; over HTTP each claim "
                          "is held by a lease ([messaging] mcp_lease_s) until the session's next call confirms it")
    ] = False,
    host: Annotated[str, typer.Option(help="HTTP: the address to listen on")] = "127.0.0.1",
    port: Annotated[int, typer.Option(min=0, max=65535, help="HTTP: the port to listen on")] = 8765,
    config: ConfigOpt = None,
) -> None:
    """Serve the model-facing tools over MCP: stdio for one session, or HTTP bound per bearer token."""
    from treemail.producers.mcp.server import serve_http, serve_stdio

    cfg = config_of(ctx, config)
    if http:
        # stderr: a supervisor's log shows where it listens, and stdout stays free.
        asyncio.run(serve_http(cfg, url_of(cfg), listen(host, port), say=lambda line: print(line, file=sys.stderr),
                               receive=receive))
    elif not session:
        raise ValueError("mcp needs --session SESSION (stdio) or --http")
    else:
        # A handle as every other command takes it, resolved before the client speaks: an unknown one is
        # one line on stderr, not a closed connection.
        async def resolve(_host, server):
            return await session_id(server, session)

        resolved = asyncio.run(with_host(cfg, resolve))
        asyncio.run(serve_stdio(cfg, url_of(cfg), resolved, run, receive))


def mcp_token(
    ctx: typer.Context,
    session: Annotated[Optional[str], typer.Argument(
        metavar="SESSION", help="the session (id or handle) the token acts for", show_default=False)] = None,
    run: Annotated[Optional[str], typer.Option(
        help="bind this run (default: the session's open run at each call)")] = None,
    ttl: Annotated[Optional[int], typer.Option(min=1, max=MAX_TOKEN_TTL_S,
                                               help="seconds until the token expires (default: never)")] = None,
    revoke: Annotated[Optional[str], typer.Option(metavar="TOKEN", help="revoke this token everywhere")] = None,
    config: ConfigOpt = None,
) -> None:
    """Mint a bearer token binding MCP over HTTP to one session, or revoke one."""

    async def action(host, server):
        if revoke:
            if not await host.tools.revoke_token(revoke):
                raise LookupError("no such token (already revoked, expired, or never minted)")
            print("revoked")
        elif not session:
            raise ValueError("mcp-token needs SESSION, or --revoke TOKEN")
        else:
            print(await host.tools.mint_token(await session_id(server, session), run, ttl))

    run_with_host(ctx, config, action)


def tool_schema(
    ctx: typer.Context,
    session: SessionArg,
    format: Annotated[ToolFormat, typer.Option(help="the framework's tool shape")] = ToolFormat.anthropic,
    config: ConfigOpt = None,
) -> None:
    """Print a session's installed tools in the shape an agent framework takes (JSON)."""

    async def action(host, server):
        schemas = await host.tools.schemas(await session_id(server, session), format.value)
        print(json.dumps(schemas, indent=2, ensure_ascii=False))

    run_with_host(ctx, config, action)


def asyncapi() -> None:
    """Print the AsyncAPI document of the command, reply and wake channels (schemas/asyncapi.json)."""
    from treemail.consumers.asyncapi import render

    sys.stdout.write(render())


def register(app: typer.Typer) -> None:
    app.command()(mcp)
    app.command("mcp-token")(mcp_token)
    app.command("tool-schema")(tool_schema)
    app.command()(asyncapi)
