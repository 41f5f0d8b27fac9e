"""The embedded Valkey's ports, against the real server binary: processes starting servers at once (make test's
two) can be handed one free port between the look and the server's bind. A server on ports it chose starts again
on new ones; a port its caller gave is tried once, and its being taken is a clear error."""

import socket
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
import redis

from treemail.adapters import embedded


@contextmanager
def taken_port() -> Iterator[int]:
    """A port some other process listens on, for the block's length."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        yield sock.getsockname()[1]


def handing_out(monkeypatch, *ports: int) -> list[int]:
    """``free_port`` answers ``ports`` first (as a race would), then looks for real; returns what it answered."""
    real, given, queue = embedded.free_port, [], list(ports)

    def free_port() -> int:
        given.append(queue.pop(0) if queue else real())
        return given[-1]

    monkeypatch.setattr(embedded, "free_port", free_port)
    return given


def answers(port: int) -> bool:
    with redis.Redis(host="127.0.0.1", port=port, socket_timeout=5) as client:
        return client.ping()


def test_a_server_handed_a_port_taken_before_its_bind_starts_on_another(monkeypatch):
    with taken_port() as taken:
        given = handing_out(monkeypatch, taken)
        server = embedded.LocalValkey().start()
        try:
            assert given[0] == taken and server.port == given[1] != taken
            assert answers(server.port)
        finally:
            server.cleanup()


def test_a_cluster_node_handed_a_taken_bus_port_starts_on_other_ports(monkeypatch):
    with taken_port() as taken:
        given = handing_out(monkeypatch, embedded.free_port(), taken)  # its own port free, its bus port taken
        node = embedded.LocalValkey(cluster_bus=True, config={"cluster-enabled": "yes"}).start()
        try:
            assert given[1] == taken and len(given) == 4 and node.bus_port == given[3] != taken
            assert answers(node.port)
        finally:
            node.cleanup()


def test_a_taken_port_the_caller_gave_is_a_clear_error(monkeypatch):
    with taken_port() as taken:
        given = handing_out(monkeypatch)
        server = embedded.LocalValkey(port=taken)
        with pytest.raises(OSError, match=f"Port {taken} is already in use"):
            server.start()
        assert given == []  # no other port tried: the caller's server would not be where the caller looks
        server.cleanup()


def test_a_port_taken_at_every_attempt_fails_after_the_last(monkeypatch):
    with taken_port() as taken:
        given = handing_out(monkeypatch, *[taken] * embedded.PORT_ATTEMPTS)
        server = embedded.LocalValkey()
        with pytest.raises(OSError, match="already in use"):
            server.start()
        assert given == [taken] * embedded.PORT_ATTEMPTS
        server.cleanup()
