"""What the CLI prints: rich tables for people, JSON lines for machines, progress that suits its stream.

A table on a terminal fits the terminal; piped or redirected it is plain
text, wide enough that ids are never cut. Progress on a terminal is a rich
bar with a rate and an ETA; anywhere else (a pipe, a CI log, a file) it is a
plain line every tenth of the way, never ``\\r`` redraws.
"""

import contextlib
import json
import sys
import time
from typing import TYPE_CHECKING
from collections.abc import Iterable, Iterator

from rich import box
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn
from rich.table import Table

if TYPE_CHECKING:  # the replay's own type, without loading the replay for a table
    from treemail.projections.replay import Progress as ProgressCallback

PIPE_WIDTH = 200


def console(stream=None) -> Console:
    stream = stream or sys.stdout
    terminal = stream.isatty()
    return Console(file=stream, width=None if terminal else PIPE_WIDTH, highlight=False,
                   soft_wrap=not terminal, emoji=False)


def json_lines(rows: Iterable[dict]) -> None:
    for row in rows:
        print(json.dumps(row, ensure_ascii=False, default=str))


def table(columns: list[tuple[str, str]], rows: Iterable[list]) -> None:
    """``columns``: (header, "left" | "right")."""
    out = Table(box=box.SIMPLE_HEAD, pad_edge=False)
    for header, justify in columns:
        out.add_column(header, justify=justify, overflow="fold")
    for row in rows:
        out.add_row(*(str(cell) for cell in row))
    console().print(out)


@contextlib.contextmanager
def progress(what: str, stream=None) -> Iterator["ProgressCallback"]:
    """The one progress display: a callback ``(done, total, events)`` for ``projections.replay.rebuild``."""
    stream = stream or sys.stderr
    if stream.isatty():
        bar = Progress(
            TextColumn(what), BarColumn(), MofNCompleteColumn(), TextColumn("sessions, {task.fields[events]:,} events"),
            TimeElapsedColumn(), TextColumn("ETA"), TimeRemainingColumn(), console=Console(file=stream),
            transient=False,
        )
        with bar:
            task = bar.add_task(what, total=None, events=0)

            def show(done: int, total: int, events: int) -> None:
                bar.update(task, completed=done, total=total, events=events)

            yield show
        return
    yield _plain(what, stream)


def _plain(what: str, stream) -> "ProgressCallback":
    started = time.monotonic()
    state = {"shown": -1}

    def show(done: int, total: int, events: int) -> None:
        step = 10 * done // max(total, 1)
        if step == state["shown"] and done != total:
            return
        state["shown"] = step
        elapsed = time.monotonic() - started
        rate = events / elapsed if elapsed > 0 else 0.0
        left = (total - done) * elapsed / done if done else 0.0
        stream.write(f"{what}: {done}/{total} sessions, {events:,} events, {rate:,.0f} events/s, "
                     f"about {left:.0f} s left\n")
        stream.flush()

    return show
