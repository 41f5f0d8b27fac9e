"""Subcommands for using treemail from any agent: `mcp`, `mcp-token`, `tool-schema`, `asyncapi`.

`add_subcommands(sub)` adds them to the `treemail` parser; each only wires a
function of the producers or consumers floor. `python -m treemail.entrypoints.agents`
runs them on their own (the tests start the stdio server that way).
"""

import argparse
import asyncio
import json
import sys

from treemail.adapters.config import load_config


def _url(config) -> str:
    from treemail.domain.errors import ConfigError

    if not config.service.redis_url:
        raise ConfigError("no server: set REDIS_URL (or [service] redis_url in TREEMAIL_CONFIG)")
    return config.service.redis_url


def cmd_mcp(args) -> None:
    from treemail.producers.mcpserver import serve_http, serve_stdio

    config = load_config(args.config)
    if args.http:
        asyncio.run(serve_http(config, _url(config), args.host, args.port))
    elif not args.session:
        raise ValueError("mcp needs --session SESSION (stdio) or --http")
    else:
        asyncio.run(serve_stdio(config, _url(config), args.session, args.run))


async def _with_host(config, action):
    from treemail.producers.host import Treemail

    host = await Treemail.connect(config, _url(config))
    try:
        return await action(host)
    finally:
        await host.close()


def cmd_mcp_token(args) -> None:
    config = load_config(args.config)

    async def action(host):
        if args.revoke:
            if not await host.revoke_token(args.revoke):
                raise LookupError("no such token (already revoked, expired, or never minted)")
            print("revoked")
        elif not args.session:
            raise ValueError("mcp-token needs SESSION, or --revoke TOKEN")
        else:
            print(await host.mint_token(args.session, args.run, args.ttl))

    asyncio.run(_with_host(config, action))


def cmd_tool_schema(args) -> None:
    config = load_config(args.config)

    async def action(host):
        print(json.dumps(await host.tool_schemas(args.session, args.format), indent=2, ensure_ascii=False))

    asyncio.run(_with_host(config, action))


def cmd_asyncapi(args) -> None:
    from treemail.consumers.asyncapi import render

    sys.stdout.write(render())


def add_subcommands(sub) -> None:
    mcp = sub.add_parser("mcp", help="serve the model-facing tools over MCP (stdio for one session, or HTTP)")
    mcp.add_argument("--session", help="stdio: the agent session this server acts for")
    mcp.add_argument("--run", help="stdio: the run it acts for (default: the session's current run at each call)")
    mcp.add_argument("--http", action="store_true", help="streamable HTTP on /mcp; each request needs a bearer token")
    mcp.add_argument("--host", default="127.0.0.1")
    mcp.add_argument("--port", type=int, default=8765)
    mcp.set_defaults(func=cmd_mcp)

    token = sub.add_parser("mcp-token", help="mint a bearer token binding MCP over HTTP to a session, or revoke one")
    token.add_argument("session", nargs="?")
    token.add_argument("--run", help="bind this run (default: the session's current run at each call)")
    token.add_argument("--ttl", type=int, default=None, help="seconds until the token expires (default: never)")
    token.add_argument("--revoke", metavar="TOKEN", help="revoke this token everywhere")
    token.set_defaults(func=cmd_mcp_token)

    schema = sub.add_parser("tool-schema", help="a session's tool definitions for an agent framework")
    schema.add_argument("session")
    schema.add_argument("--format", choices=["anthropic", "openai", "mcp"], default="anthropic")
    schema.set_defaults(func=cmd_tool_schema)

    asyncapi = sub.add_parser("asyncapi", help="print the AsyncAPI document of the worker's channels")
    asyncapi.set_defaults(func=cmd_asyncapi)


def main(argv: list[str] | None = None) -> int:
    from treemail.domain.errors import ConfigError, RedisUnavailable, UnknownSessionError

    parser = argparse.ArgumentParser(prog="treemail")
    parser.add_argument("--config")
    add_subcommands(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(argv)
    try:
        args.func(args)
    except (ConfigError, RedisUnavailable, UnknownSessionError, LookupError, ValueError) as exc:
        print(f"treemail: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
