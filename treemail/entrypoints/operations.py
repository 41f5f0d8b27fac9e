"""Subcommands for operators and hosts beyond the core: `pump`, `inspect`, `retry`, `drain`, `dispose`,
`config show`, `permissions`. ``register(app)`` adds them; each only wires a function of a lower floor."""

import asyncio
import json
from typing import Annotated, Optional

import typer

from .clicommon import ConfigOpt, JsonOpt, SessionArg, config_of, run_with_host, session_id, url_of

DEFAULT_PUMP_METRICS_PORT = 9466

config_app = typer.Typer(help="Show the configuration in force.", no_args_is_help=True, rich_markup_mode=None)


def pump(
    ctx: typer.Context,
    metrics_port: Annotated[int, typer.Option(
        envvar="TREEMAIL_PUMP_METRICS_PORT", min=-1, max=65535,
        help="port of /metrics; 0 picks a free port and logs it, -1 serves none")] = DEFAULT_PUMP_METRICS_PORT,
    interval: Annotated[float, typer.Option(envvar="TREEMAIL_PUMP_INTERVAL_S", min=0.05, max=3600,
                                            help="seconds between passes over the due index")] = 1.0,
    config: ConfigOpt = None,
) -> None:
    """Run a delivery pump: releases expired claims, parks spent messages, wakes sessions with mail due."""
    from treemail.consumers.pump import serve_pump

    cfg = config_of(ctx, config)
    asyncio.run(serve_pump(cfg, url_of(cfg), None if metrics_port < 0 else metrics_port, interval))


def _preview(text: str, limit: int = 60) -> str:
    line = " ".join(text.split())
    return line if len(line) <= limit else line[:limit - 1] + "…"


MessageArg = Annotated[str, typer.Argument(metavar="MESSAGE_ID", help="the message_id send_message returned")]


def inspect(ctx: typer.Context, message_id: MessageArg, as_json: JsonOpt = False, config: ConfigOpt = None) -> None:
    """What became of a message: accepted (with its receipt), processed, parked or refused; and its thread."""
    from treemail.producers.host import obligations as inspection

    async def action(host, server):
        text = await inspection.cli_inspect(host.obligations, message_id, as_json)
        sender = (await host.obligations.inspect(message_id)).get("sender_session_id")
        thread = await host.history.thread(sender, message_id) if sender else []
        if as_json:
            print(json.dumps({**json.loads(text), "thread": thread}, sort_keys=True))
            return
        print(text)
        if len(thread) > 1:  # a message alone is not a conversation
            print(f"thread {thread[0]['thread_id']} ({len(thread)} messages)")
            for row in thread:
                mark = "*" if row["message_id"] == message_id else " "
                print(f" {mark} {row['message_id']}  {row['from']} -> {row['to']}  {_preview(row['body'])}")

    run_with_host(ctx, config, action)


def retry(ctx: typer.Context, message_id: MessageArg, config: ConfigOpt = None) -> None:
    """Renew a parked message's retry budget (a processed or refused one cannot be rewound)."""
    from treemail.producers.host import obligations as inspection

    async def action(host, server):
        print(await inspection.cli_retry(host.obligations, message_id))

    run_with_host(ctx, config, action)


def permissions(ctx: typer.Context, session: SessionArg, as_json: JsonOpt = False, config: ConfigOpt = None) -> None:
    """A session's effective permissions: tool visibility, and what each label resolves to and why."""
    from treemail.domain.effective import render_report

    async def action(host, server):
        report = await host.permissions.effective(await session_id(server, session))
        print(json.dumps(report, ensure_ascii=False) if as_json else render_report(report))

    run_with_host(ctx, config, action)


def drain(
    ctx: typer.Context,
    session: Annotated[Optional[str], typer.Argument(
        metavar="SESSION", help="drain this session and everything below it (default: the whole service)",
        show_default=False)] = None,
    lift: Annotated[bool, typer.Option("--lift", help="take new sends again")] = False,
    config: ConfigOpt = None,
) -> None:
    """Refuse new sends from or to the service, or a session and its subtree (send_message:draining)."""
    from .lifecycle_commands import drain_command

    async def action(host, server):
        print(await drain_command(host, await session_id(server, session) if session is not None else None, lift))

    run_with_host(ctx, config, action)


def dispose(
    ctx: typer.Context,
    session: SessionArg,
    stop_reason: Annotated[Optional[str], typer.Option(
        help="completed, aborted, max_tokens, refusal, error, or any other (at most 64 bytes): the parent gets "
             "a settlement notice")] = None,
    closing_text: Annotated[Optional[str], typer.Option(help="the child's closing message, for the notice")] = None,
    config: ConfigOpt = None,
) -> None:
    """Dispose a session: the cutoff for sends, its unprocessed mail handed back to the senders, then closed."""
    from .lifecycle_commands import dispose_command

    async def action(host, server):
        print(await dispose_command(host, await session_id(server, session), stop_reason, closing_text))

    run_with_host(ctx, config, action)


@config_app.command("show")
def config_show(ctx: typer.Context, config: ConfigOpt = None) -> None:
    """The effective configuration, and which layer (file, environment, defaults) each table came from."""
    from treemail.adapters.config import show_config

    print(show_config(config or (ctx.obj or {}).get("config")), end="")


def register(app: typer.Typer) -> None:
    app.command()(pump)
    app.command()(inspect)
    app.command()(retry)
    app.command()(permissions)
    app.command()(drain)
    app.command()(dispose)
    app.add_typer(config_app, name="config")
