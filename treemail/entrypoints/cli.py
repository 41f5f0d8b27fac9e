"""The `treemail` command line (typer; tables and progress with rich).

Over the house's 200 lines: one short function per subcommand, each only
wiring the host API, a worker, a runner or the embedded server, plus the one
place (``main``) that turns every error a person can cause into one line and
a non-zero exit, never a traceback.
"""

import asyncio
import enum
import errno
import math
import os
import re
import sys
from typing import Annotated, Optional

import typer

from treemail.domain.protocol import PROTOCOL_VERSION
from treemail.host import __version__
from treemail.adapters.config import load_config
from treemail.domain.errors import ConfigError, TreemailError

from . import agents, clusterplan, gateway_command, logs, operations, timeline_commands
from .clicommon import ConfigOpt, JsonOpt, SessionArg
from .clicommon import config_of as _config
from .clicommon import run_with_host as _run
from .clicommon import session_id as _session_id
from .clicommon import url_of as _url
from .timeline_commands import DEFAULT_UI_SESSIONS

DEFAULT_WORKER_METRICS_PORT = 9464
DEFAULT_PROJECTION_METRICS_PORT = 9465

app = typer.Typer(
    name="treemail", help="Durable agent-to-agent mail for LLM agent trees, on Redis Streams (Valkey).",
    no_args_is_help=True, add_completion=False, pretty_exceptions_enable=False, rich_markup_mode=None,
    context_settings={"help_option_names": ["-h", "--help"]},
)
approvals_app = typer.Typer(help="List, approve or deny sends waiting on an `ask` rule.", no_args_is_help=True,
                            rich_markup_mode=None)
app.add_typer(approvals_app, name="approvals")

class LogFormat(str, enum.Enum):
    text = "text"
    json = "json"


def _show_version(value: bool) -> None:
    if value:
        print(f"treemail {__version__} (event protocol {PROTOCOL_VERSION})")
        raise typer.Exit()


@app.callback()
def _root(
    ctx: typer.Context,
    config: ConfigOpt = None,
    log_format: Annotated[Optional[LogFormat], typer.Option(
        "--log-format", help="text (default) or json: one JSON object per log line (or TREEMAIL_LOG_FORMAT)",
        show_default=False, case_sensitive=False)] = None,
    version: Annotated[bool, typer.Option(
        "--version", callback=_show_version, is_eager=True, help="print the version and exit")] = False,
) -> None:
    logs.setup(log_format.value if log_format else None)
    ctx.obj = {"config": config}


# -- processes -----------------------------------------------------------------------------


@app.command()
def demo(
    ctx: typer.Context,
    workers: Annotated[int, typer.Option(min=1, max=64, help="worker processes to start")] = 2,
    once: Annotated[bool, typer.Option(help="exit after the script instead of waiting for Ctrl-C")] = False,
    config: ConfigOpt = None,
) -> None:
    """Start Valkey (unless REDIS_URL), workers, a projection worker and a scripted delegation tree."""
    from .demo import run_demo

    path = config or (ctx.obj or {}).get("config")
    raise typer.Exit(run_demo(load_config(path), workers=workers, once=once, config_path=path))


@app.command()
def worker(
    ctx: typer.Context,
    metrics_port: Annotated[Optional[int], typer.Option(
        envvar="TREEMAIL_METRICS_PORT", min=-1, max=65535, show_default=False,
        help=f"port of /metrics, /healthz and /readyz (default {DEFAULT_WORKER_METRICS_PORT}, a free one if "
        "taken); 0 picks a free port and logs it, -1 serves none")] = None,
    config: ConfigOpt = None,
) -> None:
    """Run one worker process deciding send commands (scale by running more)."""
    from treemail.consumers.app import serve

    cfg = _config(ctx, config)
    port = DEFAULT_WORKER_METRICS_PORT if metrics_port is None else metrics_port
    asyncio.run(serve(cfg, _url(cfg), None if port < 0 else port, metrics_port_is_default=metrics_port is None))


@app.command()
def projections(
    ctx: typer.Context,
    metrics_port: Annotated[int, typer.Option(
        envvar="TREEMAIL_PROJECTION_METRICS_PORT", min=-1, max=65535,
        help="port of /metrics, /healthz and /readyz; 0 picks a free port and logs it, -1 serves none")
    ] = DEFAULT_PROJECTION_METRICS_PORT,
    config: ConfigOpt = None,
) -> None:
    """Run a projection worker over every partition (exactly one per deployment)."""
    from treemail.projections.service import serve

    cfg = _config(ctx, config)
    asyncio.run(serve(cfg, _url(cfg), metrics_port=metrics_port))


@app.command()
def server(
    port: Annotated[int, typer.Option(min=0, max=65535, help="port on 127.0.0.1 (0: a free one)")] = 0,
    durable: Annotated[bool, typer.Option(
        help="append-only file on (for the durable profile); data kept in --dir")] = False,
    directory: Annotated[Optional[str], typer.Option(
        "--dir", show_default=False,
        help="keep the data here across restarts (default with --durable: ~/.local/share/treemail/valkey)")
    ] = None,
) -> None:
    """Run an embedded Valkey on loopback until Ctrl-C; prints its REDIS_URL."""
    from .server import run_server, usable_directory

    # Taken as text: an empty --dir (an unset variable) would be the current directory as a Path.
    kept = usable_directory(directory) if directory is not None else None
    raise typer.Exit(run_server(port=port, durable=durable, directory=kept))


@app.command()
def cluster(
    masters: Annotated[int, typer.Option(min=1, max=16, help="cluster primaries")] = 3,
    workers: Annotated[int, typer.Option(min=0, max=64, help="worker processes to start")] = 3,
    replicas: Annotated[int, typer.Option(min=0, max=4, help=(
        "replicas per primary; with any, a failed primary is replaced by its replica and the workers run the "
        "replicated profile (unless TREEMAIL_SERVICE_PROFILE says otherwise)"))] = 0,
) -> None:
    """A local Valkey Cluster with workers and a projection worker, until Ctrl-C."""
    from .demo import run_cluster

    run_cluster(masters=masters, workers=workers, replicas=replicas)


# -- looking at a running system ------------------------------------------------------------


@app.command()
def replay(ctx: typer.Context, config: ConfigOpt = None) -> None:
    """Rebuild every projection from the session streams."""
    from treemail.projections.replay import rebuild

    from .output import progress

    from treemail.adapters import keys, members
    from treemail.projections.service import PRESENCE_MS

    async def action(host, server):
        partitions = list(range(server.config.service.partitions))
        running = await members.present(server.redis, keys.projection_members(), PRESENCE_MS)
        if running:
            print(f"treemail: warning: {len(running)} projection worker(s) running ({', '.join(running)}): "
                  "they keep views and checkpoints in memory until their next write finds this rebuild's; "
                  "restart them once it is done (or stop them first)", file=sys.stderr)
        with progress("replay") as show:
            views = await rebuild(server.store, partitions, progress=show)
        names = sorted({name for name, _ in views})
        print(f"rebuilt {', '.join(names)} over {len(partitions)} partitions")

    _run(ctx, config, action)


@app.command()
def trees(ctx: typer.Context, json: JsonOpt = False, sessions: Annotated[int, typer.Option(
              min=1, help="how many sessions the members list, the newest (as `treemail ui --sessions`)")
          ] = DEFAULT_UI_SESSIONS, config: ConfigOpt = None) -> None:
    """Each tree as `treemail ui` shows it (its sessions by handle, nested, each with its status and pending
    mail), with its summary from the projections: sessions, pending, accepted, done."""
    from treemail.adapters.viewstore import load_view
    from treemail.projections import mailboxes
    from treemail.projections.views import tree_summaries

    from .output import json_lines, table

    async def action(host, server):
        summaries = {}
        for p in range(server.config.service.partitions):
            view, _ = await load_view(server.redis, p, "trees")
            summaries.update(tree_summaries(view))
        listing = await mailboxes.sessions(server.store, server.config.service.partitions, sessions)
        shown: dict[str, list[dict]] = {}  # root id -> its listed trees: the root's own, then those whose
        for tree in mailboxes.trees(listing.rows):  # parent is not listed (or nests too deep), under it
            shown.setdefault(tree["root_session_id"], []).append(tree)
        rows = []
        for root, summary in sorted(summaries.items()):
            members = [_member(depth + (tree["session_id"] != root), row, tree["session_id"] != root and not depth)
                       for tree in shown.get(root, []) for depth, row in mailboxes.walk(tree)]
            rows.append({"root_session_id": root,
                         "root_handle": members[0]["handle"] if members and not members[0]["depth"] else None,
                         **summary, "members": members})
        if json:
            json_lines(rows)
        elif not rows:
            print("no trees in the views yet (is `treemail projections` running? `treemail replay` rebuilds them)")
        else:
            table([("session", "left"), ("status", "left"), ("pending", "right"), ("tree: sessions", "right"),
                   ("pending", "right"), ("accepted", "right"), ("done", "right")],
                  [line for r in rows for line in _tree_lines(r)])
        if listing.not_listed:  # after the rows and apart from them, as `search` prints its next page
            print(f"more: {listing.not_listed} older sessions are not among the members; see them with --sessions "
                  f"{sessions + listing.not_listed}", file=sys.stderr)

    _run(ctx, config, action)


def _member(depth: int, row: dict, detached: bool = False) -> dict:
    """A session of a tree as the rows list it; ``detached``: it heads a part of the tree shown apart from its
    parent (a parent older than the listing, or a part nested deeper than the trees nest), one below the root."""
    member = {"session_id": row["session_id"], "handle": row["handle"], "depth": depth,
              "status": row["disposal"] or row["status"], "pending": row["pending"]}
    return {**member, "detached": True} if detached else member


def _tree_lines(tree: dict) -> list[list]:
    """A tree's rows: its root with the tree's summary, then every session below it, indented by depth; a
    session shown apart from its parent is marked `… └`, and a root that is not listed is shown by its id."""
    totals = [tree["sessions"], tree["pending"], tree["accepted"], tree["done"]]
    members = tree["members"]
    lines = [] if members and not members[0]["depth"] else [[tree["root_session_id"], "", "", *totals]]
    return lines + [[("  " * m["depth"] + ("… └ " if m.get("detached") else "└ " if m["depth"] else ""))
                     + (m["handle"] or m["session_id"]), m["status"], m["pending"],
                     *(totals if m["depth"] == 0 else ["", "", "", ""])] for m in members]


@app.command()
def history(ctx: typer.Context, session: SessionArg, json: JsonOpt = False, config: ConfigOpt = None) -> None:
    """Print a session's full event history, oldest first."""
    from treemail.projections.render import history_row

    from .output import json_lines

    async def action(host, server):
        events = await host.history(await _session_id(server, session))
        if json:
            json_lines({"seq": seq, "type": type(event).__name__, **event.model_dump()} for seq, event in events)
        else:
            for seq, event in events:
                print(history_row(seq, event))

    _run(ctx, config, action)


def _when(value: str | None, option: str) -> float | None:
    """Seconds since the epoch, or an ISO-8601 time (UTC unless it says otherwise)."""
    if value is None:
        return None
    try:
        seconds = float(value)
    except ValueError:
        pass
    else:
        if not math.isfinite(seconds):  # nan would match nothing and compare false everywhere: all mail
            raise ValueError(f"{option} must be a finite number of seconds or an ISO-8601 time, got {value!r}")
        return seconds
    from datetime import datetime, timezone

    try:
        parsed = datetime.fromisoformat(value)
    except ValueError:
        raise ValueError(f"{option} must be seconds since the epoch or an ISO-8601 time, got {value!r}") from None
    return (parsed if parsed.tzinfo else parsed.replace(tzinfo=timezone.utc)).timestamp()


@app.command()
def search(
    ctx: typer.Context, session: SessionArg,
    text: Annotated[Optional[str], typer.Option(help="words the body contains (any case)")] = None,
    sender: Annotated[Optional[str], typer.Option(help="who sent it: a handle or a session id")] = None,
    since: Annotated[Optional[str], typer.Option(help="accepted at or after (epoch seconds or ISO-8601)")] = None,
    until: Annotated[Optional[str], typer.Option(help="accepted before (epoch seconds or ISO-8601)")] = None,
    limit: Annotated[int, typer.Option(help="at most this many, newest first (1 to 100)")] = 20,
    cursor: Annotated[Optional[str], typer.Option(help="the next page of the same search: the cursor the "
                                                       "previous page printed")] = None,
    json: JsonOpt = False, config: ConfigOpt = None,
) -> None:
    """Search the mail of a session's tree by text, sender and time, newest first, a page at a time."""
    from .output import json_lines

    window = (_when(since, "--since"), _when(until, "--until"))

    async def action(host, server):
        found = await host.history.search_page(await _session_id(server, session), text=text, sender=sender,
                                               since=window[0], until=window[1], limit=limit, cursor=cursor)
        rows = found["messages"]
        if json:
            json_lines(rows)
        else:
            if not rows:
                print("no message matches")
            for row in rows:
                print(f"{row['message_id']}  {row['from']} -> {row['to']}  {_preview(row['body'])}")
        if "next_cursor" in found:  # on stderr: the rows (or JSON lines) stay all that stdout holds
            print(f"more: the same search with --cursor {found['next_cursor']}", file=sys.stderr)

    _run(ctx, config, action)


@app.command()
def tail(
    ctx: typer.Context, session: SessionArg,
    from_start: Annotated[bool, typer.Option(help="print the session's mail so far first, then follow")] = False,
    config: ConfigOpt = None,
) -> None:
    """Follow a session's mail rows (ProducerMessage* events) live, until Ctrl-C."""
    from treemail.projections.tail import tail as follow

    async def action(host, server):
        record = await server.record(await _session_id(server, session))
        async for row in follow(server.store, record, from_start=from_start):
            print(row, flush=True)

    _run(ctx, config, action)


@approvals_app.command("list")
def approvals_list(ctx: typer.Context, json: JsonOpt = False, config: ConfigOpt = None) -> None:
    """Sends waiting for a person."""
    from .output import json_lines, table

    async def action(host, server):
        requests = await host.permissions.pending_approvals()
        if json:
            json_lines(requests)
        elif not requests:
            print("no approval requests are waiting")
        else:
            table([("request", "left"), ("from", "left"), ("to", "left"), ("rule", "left"), ("mode", "left"),
                   ("body", "left")],
                  [[r["request_id"], r["sender_handle"], r["recipient_handle"], r["label"], r["mode"],
                    _preview(r["body"])] for r in requests])

    _run(ctx, config, action)


RequestArg = Annotated[Optional[str], typer.Argument(
    metavar="REQUEST_ID", help="the request id `treemail approvals list` shows", show_default=False)]


def _need(request_id: str | None) -> str:
    if not request_id:
        raise ConfigError("approve and deny need a request id (see `treemail approvals list`)")
    return request_id


@approvals_app.command("approve")
def approvals_approve(
    ctx: typer.Context, request_id: RequestArg = None,
    tree: Annotated[bool, typer.Option(help="also let later sends of this relationship in this tree through")]
    = False,
    config: ConfigOpt = None,
) -> None:
    """Let a waiting send through, once or for the whole tree."""
    request_id = _need(request_id)

    async def action(host, server):
        request = await host.permissions.approve(request_id, scope="tree" if tree else "once")
        print(f"approved {request['request_id']} ({request['decision']})")

    _run(ctx, config, action)


@approvals_app.command("deny")
def approvals_deny(ctx: typer.Context, request_id: RequestArg = None, config: ConfigOpt = None) -> None:
    """Refuse a waiting send."""
    request_id = _need(request_id)

    async def action(host, server):
        request = await host.permissions.deny(request_id)
        print(f"denied {request['request_id']}")

    _run(ctx, config, action)


@app.command("dead-letters")
def dead_letters(
    ctx: typer.Context,
    count: Annotated[int, typer.Option(min=1, max=100_000, help="show at most this many, newest first")] = 50,
    json: JsonOpt = False, config: ConfigOpt = None,
) -> None:
    """Commands set aside: malformed, or still failing after max_deliveries."""
    from treemail.adapters import keys

    from .output import json_lines, table

    async def action(host, server):
        entries = await server.redis.xrevrange(keys.dead_letters(), count=count)
        rows = [{"id": entry_id.decode(), **{k.decode(): v.decode(errors="replace") for k, v in fields.items()}}
                for entry_id, fields in entries]
        if json:
            json_lines(rows)
        elif not rows:
            print("no dead letters")
        else:
            table([("id", "left"), ("reason", "left"), ("stream", "left"), ("entry", "left"), ("consumer", "left"),
                   ("command", "left")],
                  [[r["id"], r.get("reason"), r.get("stream"), r.get("entry_id"), r.get("consumer"),
                    _preview(r.get("data", ""), 100)] for r in rows])
        # After the rows and on stderr, as search's next page: stdout holds the rows (or JSON lines) alone.
        for line in _letters_not_shown(await _letters_kept_and_ever(server.redis), len(rows)):
            print(line, file=sys.stderr)

    _run(ctx, config, action)


@app.command()
def schema(
    protocol: Annotated[bool, typer.Option(
        "--protocol", help="the whole protocol (stream entries, commands, the tool, results, errors, wake "
        "triggers, events: schemas/protocol.schema.json) instead of the events alone")] = False,
) -> None:
    """Print the JSON Schema of every event type (schemas/events.schema.json), or of the whole protocol."""
    if protocol:
        from treemail.entrypoints.protocolschema import render
    else:
        from treemail.domain.schema import render

    sys.stdout.write(render())


async def _letters_kept_and_ever(redis) -> tuple[int, int]:
    """The dead-letter stream's length and every letter it was ever given (0, 0 before the first)."""
    from treemail.adapters import keys

    if not await redis.exists(keys.dead_letters()):
        return 0, 0
    info = await redis.xinfo_stream(keys.dead_letters())
    return info["length"], info["entries-added"]


def _letters_not_shown(kept_and_ever: tuple[int, int], shown: int) -> list[str]:
    """What a page of dead letters leaves out, so a bounded view never hides that more exist: the older
    letters past ``--count``, and those the stream's bound has trimmed (each one's producer was told when it
    was set aside, and ``treemail_dead_letters_total`` counted it)."""
    from treemail.consumers.deadletters import MAXLEN

    kept, ever = kept_and_ever
    lines = []
    if kept > shown:
        lines.append(f"more: {kept - shown} older dead letters kept; see them with --count {kept}")
    if ever > kept:
        lines.append(f"trimmed: {ever - kept} older dead letters are no longer kept (the stream keeps about "
                     f"the last {MAXLEN:,})")
    return lines


def _preview(text: str, limit: int = 60) -> str:
    flat = " ".join(text.split())
    return flat if len(flat) <= limit else flat[: limit - 1] + "…"


agents.register(app)
operations.register(app)
timeline_commands.register(app)
clusterplan.register(app)
gateway_command.register(app)


# -- errors --------------------------------------------------------------------------------

# Every error under treemail's root is a refusal with its code, said in one line; and the builtin errors a value
# that cannot be parsed raises.
USER_ERRORS = (TreemailError, LookupError, ValueError)


# An OSError these name comes from where the output goes (a full disk, a closed or failing file), never from a
# connection to the server.
OUTPUT_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EIO, errno.EBADF, errno.EROFS})

# An error line shows at most this much: whatever was typed is echoed as a prefix, never whole.
MAX_ERROR_CHARS = 500


def _error(message: str) -> int:
    if len(message) > MAX_ERROR_CHARS:
        message = message[:MAX_ERROR_CHARS - 1] + "…"
    # A lone surrogate (a byte that was not UTF-8 in what was typed) is shown escaped, never a crash.
    print(f"treemail: error: {message}".encode("utf-8", "backslashreplace").decode("utf-8"), file=sys.stderr)
    return 2


def _quiet_stdout() -> None:
    # The reader went away (`| head`), or the output cannot be written: later writes, and the flush at exit,
    # must not complain.
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError, AttributeError):
        pass  # no stdout left to quiet


def main(argv: list[str] | None = None) -> int:
    from redis.exceptions import MovedError, RedisError, ResponseError

    command = typer.main.get_command(app)
    try:
        result = command.main(args=sys.argv[1:] if argv is None else argv, prog_name="treemail",
                              standalone_mode=False)
        return result if isinstance(result, int) else 0
    except typer.Exit as done:
        return done.exit_code
    except (typer.Abort, KeyboardInterrupt):
        return 130
    except BrokenPipeError:
        _quiet_stdout()
        return 141
    except typer.TyperException as usage:  # a usage error: bad option, value, command or argument
        message = usage.format_message()
        if "\n" in message:  # a group called without a command: its help is the message
            print(message)
        elif message:  # empty when the help was already printed
            _error(f"{message} (see `{_command_path(usage)} --help`)")
        return usage.exit_code
    except USER_ERRORS as exc:
        # What a person typed or pointed at is wrong: say so, no traceback.
        return _error(str(exc))
    except MovedError:
        return _error("the server is a Redis/Valkey Cluster node (MOVED): set TREEMAIL_SERVICE_CLUSTER=true "
                      "or [service] cluster = true")
    except ResponseError as exc:
        if re.match(r"(MOVED|CROSSSLOT|ASK)\b", str(exc)):
            return _error("the server is a Redis/Valkey Cluster node: set TREEMAIL_SERVICE_CLUSTER=true "
                          "or [service] cluster = true")
        return _error(f"the server refused a command: {exc}")
    except OSError as exc:
        if exc.errno in OUTPUT_ERRNOS:  # what the output was sent to, not the server
            _quiet_stdout()
            return _error(f"cannot write the output: {exc.strerror}")
        return _error(f"Redis/Valkey: {type(exc).__name__}: {exc}")
    except RedisError as exc:
        return _error(f"Redis/Valkey: {type(exc).__name__}: {exc}")


def _command_path(usage) -> str:
    ctx = getattr(usage, "ctx", None)
    return getattr(ctx, "command_path", None) or "treemail"


if __name__ == "__main__":
    sys.exit(main())
