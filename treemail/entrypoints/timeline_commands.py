"""`treemail timeline` (a session's mailbox through time, in the terminal) and `treemail ui` (the same in a
browser). ``register(app)`` adds them; each wires ``projections.timeline`` and ``projections.mailboxes``.
"""

import contextlib
import datetime as dt
from typing import Annotated, Optional

import typer

from treemail.domain import limits
from treemail.domain.errors import ConfigError

from .clicommon import ConfigOpt, JsonOpt, SessionArg, config_of, run_with_host, session_id, url_of
from .httpserve import serve_until_stopped

DEFAULT_UI_PORT = 8780
# The page's history cache (projections.mailboxes.HistoryCache), in MiB: a few thousand sessions of a few
# hundred events with bodies of a few KB.
DEFAULT_HISTORY_CACHE_MB = 256
# The sessions the page's trees list, the newest: ``projections.mailboxes.MAX_SESSIONS`` (not imported here, where
# every command's start-up would pay for it; a test holds the two equal).
DEFAULT_UI_SESSIONS = 2000

AtOpt = Annotated[Optional[str], typer.Option(
    "--at", metavar="POSITION|TIME", show_default=False,
    help="the mailbox at this stream position (an integer) or time (ISO 8601, e.g. 2026-12-02T10:15:00Z; "
    "UTC unless it says otherwise); default: now")]


def parse_at(text: str | None, history) -> int | None:
    """A position as given, or the last position appended at or before a time."""
    from treemail.projections.timeline import position_at_time

    if text is None:
        return None
    # ASCII digits only: `²` is a digit to str.isdigit and not to int(), and `٣` would be read as 3.
    if text.strip().isascii() and text.strip().isdigit():
        return int(text)
    try:
        when = dt.datetime.fromisoformat(text.strip())
    except ValueError:
        raise ValueError(f"--at takes a position (an integer) or an ISO 8601 time such as 2026-12-02T10:15:00Z, "
                         f"got {limits.shown(text)}") from None
    if when.tzinfo is None:
        when = when.replace(tzinfo=dt.timezone.utc)
    return position_at_time(history, when.timestamp())


def timeline(ctx: typer.Context, session: SessionArg, at: AtOpt = None, as_json: JsonOpt = False,
             config: ConfigOpt = None) -> None:
    """A session's mailbox at any point (pending, claimed, consumed, returned, parked) and, step by step,
    what each run consumed and sent."""
    import json

    from treemail.projections import mailboxes
    from treemail.projections import timeline as tl

    async def action(host, server):
        sid = await session_id(server, session)
        histories = await mailboxes.with_recipients(server.store, sid,
                                                     await mailboxes.histories_for(server.store, sid))
        position = parse_at(at, histories[sid])
        last = histories[sid][-1][0] if histories[sid] else 0
        if position is not None and not 0 <= position <= last:
            raise ValueError(f"position {position} is not in the session's history (0..{last})")
        found = tl.timeline(sid, histories, position)
        if as_json:
            print(json.dumps(found.to_json(), ensure_ascii=False))
        else:
            print_timeline(found)

    run_with_host(ctx, config, action)


def _short(message_id: str) -> str:
    return message_id[-8:]


def _when(at: float) -> str:
    return dt.datetime.fromtimestamp(at, dt.timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC") if at else "-"


def _preview(text: str, limit: int = 48) -> str:
    flat = " ".join(text.split())
    return flat if len(flat) <= limit else flat[: limit - 1] + "…"


def print_timeline(found) -> None:
    from rich import box
    from rich.table import Table

    from .output import console

    out = console()
    at_time = next((t for seq, _, t in reversed(found.positions) if seq <= found.at), 0.0)
    name = found.handle or found.session_id
    out.print(f"[bold]{name}[/] ({found.session_id}) at position {found.at} of {found.last}, {_when(at_time)}")
    if found.fork:
        out.print(f"forked from {found.fork['source_session_id']} at its position {found.fork['at_position']}")
    for revert in found.reverts:
        out.print(f"reverted at position {revert['position']}: positions {revert['to_position'] + 1}.."
                  f"{revert['from_position']} abandoned")

    mailbox = Table(title="mailbox", title_justify="left", box=box.SIMPLE_HEAD, pad_edge=False)
    for header in ("state", "message", "from", "mode", "run", "step", "position", "thread", "body"):
        mailbox.add_column(header, overflow="fold")
    for state, messages in found.mailbox().items():
        for m in messages:
            # A notice names the session it is about, never as its author: it shows as treemail's (its owner).
            sender = (m.sender_handle or m.sender_session_id) if m.owner == "agent" else m.owner
            # Why it is where it is, in every state (a pending one may be stranded, released or fell back from steer).
            reason = f" ({m.reason})" if m.reason else ""
            mailbox.add_row(state + reason, m.message_id, sender, m.mode, m.run_id or "",
                            "" if m.step is None else str(m.step), str(m.position), _thread_mark(found, m),
                            _preview(m.body))
    if not found.messages:
        mailbox.add_row("(empty)", "", "", "", "", "", "", "", "")
    out.print(mailbox)
    print_threads(found)

    steps = Table(title="steps (message ids end with)", title_justify="left", box=box.SIMPLE_HEAD, pad_edge=False)
    for header in ("run", "step", "positions", "claimed", "consumed", "sent", "tokens", "note"):
        steps.add_column(header, overflow="fold")
    for run in found.runs:
        ended = f", {run.reason}" if run.reason else (", open" if run.finished is None else "")
        label = f"{run.run_id}{ended}"
        if not run.steps:
            steps.add_row(label, "", "", "", "", "", "", _note(run))
        for step in run.steps:
            steps.add_row(label, f"{step.step}{'' if step.reported else '*'}", f"{step.first}..{step.last}",
                          " ".join(map(_short, step.claimed)), " ".join(map(_short, step.consumed)),
                          " ".join(map(_short, step.sent)), str(step.tokens or ""), _note(step))
            label = ""
    if found.sent_outside_runs:
        steps.add_row("(no run)", "", "", "", "", " ".join(map(_short, found.sent_outside_runs)), "", "")
    out.print(steps)
    if any(not s.reported for r in found.runs for s in r.steps):
        out.print("* not reported by the host: counted one per claim (0: sent before the run's first claim)")


def _thread_mark(found, message) -> str:
    """The thread a message belongs to (its id's end), when it is part of a conversation listed below."""
    return _short(message.thread_id) if any(t.thread_id == message.thread_id for t in found.threads) else ""


def print_threads(found) -> None:
    """Each conversation as a reply tree: a reply indented under the message it answers."""
    from .output import console

    out = console()
    for thread in found.threads:
        out.print(f"[bold]thread {_short(thread.thread_id)}[/] ({len(thread.posts)} messages)", highlight=False)
        for post in thread.posts:
            sender = post.sender_handle or post.sender_session_id or "host"
            recipient = post.recipient_handle or post.recipient_session_id
            out.print(f"  {'  ' * post.depth}{'↳ ' if post.depth else ''}{_short(post.message_id)} {sender} -> "
                      f"{recipient}: {_preview(post.body)}", highlight=False, markup=False)


def _note(item) -> str:
    if item.inherited_from:
        return f"inherited from {item.inherited_from}"
    if item.reverted_by:
        return f"reverted at {item.reverted_by}"
    return ""


def ui(
    ctx: typer.Context,
    host: Annotated[str, typer.Option(help="address to bind: loopback unless told otherwise")] = "127.0.0.1",
    port: Annotated[int, typer.Option(min=0, max=65535, help="port (0: a free one)")] = DEFAULT_UI_PORT,
    token: Annotated[Optional[str], typer.Option(
        envvar="TREEMAIL_UI_TOKEN", show_default=False,
        help="the operator's token: write actions (retry, approve, deny) need it; without one the page is "
        "read-only")] = None,
    history_cache_mb: Annotated[int, typer.Option(
        min=0, envvar="TREEMAIL_UI_HISTORY_CACHE_MB",
        help="memory for the histories the page keeps read (MiB, estimated per event; the least recently read "
        "session is let go first; 0 keeps none)")] = DEFAULT_HISTORY_CACHE_MB,
    sessions: Annotated[int, typer.Option(
        min=1, envvar="TREEMAIL_UI_SESSIONS",
        help="how many sessions the trees list, the newest; the page says how many older ones it leaves "
        "out")] = DEFAULT_UI_SESSIONS,
    config: ConfigOpt = None,
) -> None:
    """Serve the mailbox time-travel page: delegation trees, each session's mailbox through time, a message's
    lifecycle and causal chain, open obligations, live."""
    from .ui import LOOPBACK_HOSTS, Page, create_app

    cfg = config_of(ctx, config)
    url_of(cfg)  # no server configured: one line, before anything starts
    access = "write actions need the operator's token" if token else "read-only (no TREEMAIL_UI_TOKEN)"

    @contextlib.asynccontextmanager
    async def opened():
        page = Page(cfg, token or None, history_cache_mb * 2**20, sessions)
        await page.open()
        try:
            yield create_app(cfg, loopback_only=host in LOOPBACK_HOSTS, page=page)
        finally:
            await page.close()

    serve_until_stopped(host, port, opened, lambda address: f"treemail ui at {address}/ ({access}); Ctrl-C stops it")


def register(app: typer.Typer) -> None:
    app.command()(timeline)
    app.command()(ui)
