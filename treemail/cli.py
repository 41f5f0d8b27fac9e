"""The `treemail` command line."""

import argparse
import asyncio
import json
import logging
import os
import signal
import subprocess
import sys

from .config import load_config
from .errors import ConfigError, RedisUnavailable


def _url(config) -> str:
    url = config.service.redis_url
    if not url:
        raise ConfigError("no server: set REDIS_URL (or [service] redis_url in TREEMAIL_CONFIG)")
    return url


def cmd_worker(args) -> None:
    from consumers.app import serve

    config = load_config(args.config)
    asyncio.run(serve(config, _url(config)))


def cmd_demo(args) -> None:
    from .demo import run_demo

    run_demo(load_config(args.config), workers=args.workers, once=args.once)


def cmd_server(args) -> None:
    from .embedded import LocalValkey

    server = LocalValkey(durable=args.durable, port=args.port).start()
    print(f"REDIS_URL={server.url}", flush=True)
    try:
        signal.sigwait({signal.SIGINT, signal.SIGTERM})
    finally:
        server.cleanup()


async def _with_host(config, action):
    from .host import Treemail

    host = await Treemail.connect(config, _url(config))
    try:
        return await action(host)
    finally:
        await host.close()


def cmd_approvals(args) -> None:
    config = load_config(args.config)

    async def action(host):
        if args.action == "list":
            for request in await host.pending_approvals():
                print(
                    f"{request['request_id']}  {request['sender_handle']} -> {request['recipient_handle']} "
                    f"({request['label']}, {request['mode']}): {request['body'][:60]!r}"
                )
        elif args.action == "approve":
            request = await host.approve(args.request_id, scope="tree" if args.tree else "once")
            print(f"approved {request['request_id']} ({request['decision']})")
        else:
            request = await host.deny(args.request_id)
            print(f"denied {request['request_id']}")

    asyncio.run(_with_host(config, action))


def cmd_history(args) -> None:
    from .render import history_row

    config = load_config(args.config)

    async def action(host):
        for seq, event in await host.history(args.session):
            if args.json:
                print(json.dumps({"seq": seq, "type": type(event).__name__, **event.model_dump()}))
            else:
                print(history_row(seq, event))

    asyncio.run(_with_host(config, action))


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="treemail", description="durable agent-to-agent mail")
    parser.add_argument("--config", help="TOML file with [messaging] and [service] tables (or TREEMAIL_CONFIG)")
    sub = parser.add_subparsers(dest="command", required=True)

    demo = sub.add_parser("demo", help="start Valkey (unless REDIS_URL), workers, and a scripted delegation tree")
    demo.add_argument("--workers", type=int, default=2)
    demo.add_argument("--once", action="store_true", help="exit after the script instead of waiting for Ctrl-C")
    demo.set_defaults(func=cmd_demo)

    worker = sub.add_parser("worker", help="run one worker process deciding send commands")
    worker.set_defaults(func=cmd_worker)

    server = sub.add_parser("server", help="run an embedded Valkey on loopback and print its URL")
    server.add_argument("--port", type=int, default=0)
    server.add_argument("--durable", action="store_true", help="append-only file on (for the durable profile)")
    server.set_defaults(func=cmd_server)

    approvals = sub.add_parser("approvals", help="list, approve or deny sends waiting on an `ask` rule")
    approvals.add_argument("action", choices=["list", "approve", "deny"])
    approvals.add_argument("request_id", nargs="?")
    approvals.add_argument("--tree", action="store_true", help="approve for the whole session tree")
    approvals.set_defaults(func=cmd_approvals)

    history = sub.add_parser("history", help="print a session's full mail history")
    history.add_argument("session")
    history.add_argument("--json", action="store_true")
    history.set_defaults(func=cmd_history)
    return parser


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=os.environ.get("TREEMAIL_LOG", "WARNING"), format="%(asctime)s %(name)s %(message)s")
    args = build_parser().parse_args(argv)
    if getattr(args, "action", None) in ("approve", "deny") and not args.request_id:
        print("treemail: error: approve and deny need a request id", file=sys.stderr)
        return 2
    try:
        args.func(args)
    except (ConfigError, RedisUnavailable) as exc:
        print(f"treemail: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
