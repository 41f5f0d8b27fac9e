"""The `treemail` command line.

Over the house's 200 lines: one short function per subcommand, then the
argument wiring; each function only wires the host API, a worker or a runner.
"""

import argparse
import asyncio
import json
import logging
import os
import signal
import sys

from treemail.adapters.config import load_config
from treemail.domain.errors import ConfigError, LifecycleError, RedisUnavailable, UnknownSessionError


def _url(config) -> str:
    url = config.service.redis_url
    if not url:
        raise ConfigError("no server: set REDIS_URL (or [service] redis_url in TREEMAIL_CONFIG)")
    return url


DEFAULT_WORKER_METRICS_PORT = 9464


def _resolve_metrics_port(args) -> None:
    """Flag, else TREEMAIL_METRICS_PORT, else the default; only the default may move if taken."""
    args.metrics_port_is_default = False
    if args.metrics_port is not None:
        return
    raw = os.environ.get("TREEMAIL_METRICS_PORT", "").strip()
    if not raw:
        args.metrics_port, args.metrics_port_is_default = DEFAULT_WORKER_METRICS_PORT, True
        return
    try:
        args.metrics_port = int(raw)
    except ValueError:
        raise ConfigError(f"TREEMAIL_METRICS_PORT must be a port number, 0 or -1, not {raw!r}") from None


def cmd_worker(args) -> None:
    from treemail.consumers.app import serve

    config = load_config(args.config)
    _resolve_metrics_port(args)
    port = None if args.metrics_port < 0 else args.metrics_port
    asyncio.run(serve(config, _url(config), port, metrics_port_is_default=args.metrics_port_is_default))


def cmd_demo(args) -> None:
    from .demo import run_demo

    run_demo(load_config(args.config), workers=args.workers, once=args.once)


def cmd_cluster(args) -> None:
    from .demo import run_cluster

    run_cluster(masters=args.masters, workers=args.workers)


def cmd_server(args) -> None:
    from treemail.adapters.embedded import LocalValkey

    # Blocked first, so sigwait (not the default action) receives them and the cleanup below runs.
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM})
    server = LocalValkey(durable=args.durable, port=args.port).start()
    print(f"REDIS_URL={server.url}", flush=True)
    try:
        signal.sigwait({signal.SIGINT, signal.SIGTERM})
    finally:
        server.cleanup()


async def _with_host(config, action):
    from treemail.producers.host import Treemail

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
    from treemail.projections.render import history_row

    config = load_config(args.config)

    async def action(host):
        for seq, event in await host.history(args.session):
            if args.json:
                print(json.dumps({"seq": seq, "type": type(event).__name__, **event.model_dump()}))
            else:
                print(history_row(seq, event))

    asyncio.run(_with_host(config, action))


def cmd_tail(args) -> None:
    from treemail.projections.tail import tail

    config = load_config(args.config)

    async def action(host):
        record = await host.sessions.record(args.session)
        async for row in tail(host.store, record, from_start=args.from_start):
            print(row, flush=True)

    asyncio.run(_with_host(config, action))


def cmd_projections(args) -> None:
    from treemail.projections.service import serve

    config = load_config(args.config)
    asyncio.run(serve(config, _url(config), metrics_port=args.metrics_port))


def cmd_replay(args) -> None:
    from treemail.projections.replay import progress_bar, rebuild

    config = load_config(args.config)

    async def action(host):
        partitions = list(range(config.service.partitions))
        views = await rebuild(host.store, partitions, progress=progress_bar())
        names = sorted({name for name, _ in views})
        print(f"rebuilt {', '.join(names)} over {len(partitions)} partitions")

    asyncio.run(_with_host(config, action))


def cmd_trees(args) -> None:
    from treemail.adapters.viewstore import load_view
    from treemail.projections.views import tree_summaries

    config = load_config(args.config)

    async def action(host):
        print(f"{'root session':<38} {'sessions':>8} {'pending':>8} {'accepted':>9} {'done':>8}")
        for p in range(config.service.partitions):
            view, _ = await load_view(host.redis, p, "trees")
            for root, s in sorted(tree_summaries(view).items()):
                print(f"{root:<38} {s['sessions']:>8} {s['pending']:>8} {s['accepted']:>9} {s['done']:>8}")

    asyncio.run(_with_host(config, action))


def cmd_dead_letters(args) -> None:
    from treemail.adapters import keys

    config = load_config(args.config)

    async def action(host):
        entries = await host.redis.xrevrange(keys.dead_letters(), count=args.count)
        if not entries:
            print("no dead letters")
        for entry_id, fields in entries:
            f = {k.decode(): v.decode(errors="replace") for k, v in fields.items()}
            print(f"{entry_id.decode()}  {f.get('reason')}  {f.get('stream')} {f.get('entry_id')}  "
                  f"consumer={f.get('consumer')}  {f.get('data', '')[:100]!r}")

    asyncio.run(_with_host(config, action))


def cmd_schema(args) -> None:
    from treemail.domain.schema import render

    sys.stdout.write(render())


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="treemail", description="durable agent-to-agent mail")
    parser.add_argument("--config", help="TOML file with [messaging] and [service] tables (or TREEMAIL_CONFIG)")
    sub = parser.add_subparsers(dest="command", required=True)

    demo = sub.add_parser("demo", help="start Valkey (unless REDIS_URL), workers, and a scripted delegation tree")
    demo.add_argument("--workers", type=int, default=2)
    demo.add_argument("--once", action="store_true", help="exit after the script instead of waiting for Ctrl-C")
    demo.set_defaults(func=cmd_demo)

    worker = sub.add_parser("worker", help="run one worker process deciding send commands")
    worker.add_argument(
        "--metrics-port", type=int, default=None,
        help=f"Prometheus /metrics port (default TREEMAIL_METRICS_PORT, else {DEFAULT_WORKER_METRICS_PORT}); "
        "0 picks a free port and logs it, -1 serves none",
    )
    worker.set_defaults(func=cmd_worker)

    server = sub.add_parser("server", help="run an embedded Valkey on loopback and print its URL")
    server.add_argument("--port", type=int, default=0)
    server.add_argument("--durable", action="store_true", help="append-only file on (for the durable profile)")
    server.set_defaults(func=cmd_server)

    cluster = sub.add_parser("cluster", help="a local Valkey Cluster with workers and a projection worker")
    cluster.add_argument("--masters", type=int, default=3)
    cluster.add_argument("--workers", type=int, default=3)
    cluster.set_defaults(func=cmd_cluster)

    approvals = sub.add_parser("approvals", help="list, approve or deny sends waiting on an `ask` rule")
    approvals.add_argument("action", choices=["list", "approve", "deny"])
    approvals.add_argument("request_id", nargs="?")
    approvals.add_argument("--tree", action="store_true", help="approve for the whole session tree")
    approvals.set_defaults(func=cmd_approvals)

    history = sub.add_parser("history", help="print a session's full mail history")
    history.add_argument("session")
    history.add_argument("--json", action="store_true")
    history.set_defaults(func=cmd_history)
    tail = sub.add_parser("tail", help="print a session's ProducerMessage* rows live")
    tail.add_argument("session")
    tail.add_argument("--from-start", action="store_true", help="replay the session's mail first")
    tail.set_defaults(func=cmd_tail)

    projections = sub.add_parser("projections", help="run a projection worker over every partition")
    projections.add_argument("--metrics-port", type=int,
                             default=int(os.environ.get("TREEMAIL_PROJECTION_METRICS_PORT", "9465")),
                             help="Prometheus port (0: a free one, -1: none)")
    projections.set_defaults(func=cmd_projections)

    replay = sub.add_parser("replay", help="rebuild every projection from the session streams")
    replay.set_defaults(func=cmd_replay)

    trees = sub.add_parser("trees", help="per-tree summary from the projections")
    trees.set_defaults(func=cmd_trees)

    dead = sub.add_parser("dead-letters", help="commands set aside as malformed or after max_deliveries")
    dead.add_argument("--count", type=int, default=50)
    dead.set_defaults(func=cmd_dead_letters)

    schema = sub.add_parser("schema", help="print the JSON Schema of every event type")
    schema.set_defaults(func=cmd_schema)
    return parser


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=os.environ.get("TREEMAIL_LOG", "WARNING"), format="%(asctime)s %(name)s %(message)s")
    args = build_parser().parse_args(argv)
    if getattr(args, "action", None) in ("approve", "deny") and not args.request_id:
        print("treemail: error: approve and deny need a request id", file=sys.stderr)
        return 2
    try:
        args.func(args)
    except (ConfigError, RedisUnavailable, UnknownSessionError, LifecycleError, LookupError, ValueError) as exc:
        # What a person typed or pointed at is wrong: say so, no traceback.
        print(f"treemail: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
