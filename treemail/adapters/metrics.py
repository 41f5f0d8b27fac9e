"""Prometheus metrics of worker and projection processes.

Each process serves its own registry on its own port (``treemail worker
--metrics-port``, or TREEMAIL_METRICS_PORT; 0 picks a free one and logs it), so
several processes on one host never clash and no multiprocess directory is
needed. Labels are bounded:
outcome codes, command streams, consumer groups, projections, partitions
never sessions or trees.
"""

import errno
import logging
from wsgiref.simple_server import WSGIServer

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, ProcessCollector, start_http_server

from ..domain.errors import ConfigError

log = logging.getLogger("treemail.metrics")

REGISTRY = CollectorRegistry(auto_describe=True)
# CPU, memory and file descriptors of the process: a worker that leaks or spins shows here first.
ProcessCollector(registry=REGISTRY)

SENDS = Counter(
    "treemail_sends", "send_message decisions by outcome (ok, or the error code)", ["outcome"], registry=REGISTRY
)
DECISION_SECONDS = Histogram(
    "treemail_decision_seconds",
    "Time from reading a command batch to its decisions being durable, per command",
    buckets=(0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5),
    registry=REGISTRY,
)
BATCH_SIZE = Histogram(
    "treemail_batch_size", "Commands per batch a worker decided", buckets=(1, 2, 5, 10, 25, 50, 100, 250, 500, 1000),
    registry=REGISTRY,
)
CONFLICT_ROUNDS = Counter(
    "treemail_conflict_retries", "Commands decided again after another writer appended first", registry=REGISTRY
)
COMMAND_BACKLOG = Gauge(
    "treemail_command_backlog", "Commands not yet read by the worker group (lag)", ["stream"], registry=REGISTRY
)
COMMAND_PENDING = Gauge(
    "treemail_command_pending", "Commands read but not acknowledged (pending entries)", ["stream"], registry=REGISTRY
)
WORKER_CONSUMERS = Gauge(
    "treemail_worker_consumers", "Consumers of the worker group seen active recently", ["stream"], registry=REGISTRY
)
DEAD_LETTERS = Counter(
    "treemail_dead_letters", "Commands moved to the dead-letter stream", ["reason"], registry=REGISTRY
)

PROJECTION_EVENTS = Counter(
    "treemail_projection_events", "Events folded into projections", ["projection"], registry=REGISTRY
)
PROJECTION_LAG_EVENTS = Gauge(
    "treemail_projection_lag_events", "Feed entries not yet folded", ["projection", "partition"], registry=REGISTRY
)
PROJECTION_LAG_SECONDS = Gauge(
    "treemail_projection_lag_seconds", "Age of the oldest feed entry not yet folded", ["projection", "partition"],
    registry=REGISTRY,
)
PENDING_INBOX = Gauge(
    "treemail_pending_agent_mail", "Pending agent mail over all sessions", registry=REGISTRY
)
FULL_INBOXES = Gauge(
    "treemail_full_inboxes", "Sessions whose pending agent mail reached max_pending_per_session", registry=REGISTRY
)
INFLIGHT_PAIRS = Gauge(
    "treemail_inflight_pairs", "Directed pairs with unacknowledged agent mail", registry=REGISTRY
)
FULL_WINDOWS = Gauge(
    "treemail_full_windows", "Directed pairs whose window reached max_inflight_per_pair", registry=REGISTRY
)
WAKES = Counter("treemail_wakes", "Wake requests emitted", registry=REGISTRY)
WAKES_OUTSTANDING = Gauge(
    "treemail_wakes_outstanding", "Sessions with a wake requested and no run started yet", registry=REGISTRY
)
APPROVALS_PENDING = Gauge("treemail_approvals_pending", "Approval requests waiting for a person", registry=REGISTRY)
# Seed 002: counted in the process that disposes or finishes the child (the host's), never failing either.
SETTLEMENT_FAILURES = Counter(
    "treemail_settlement_notice_failures", "Settlement notices that could not be delivered to a parent",
    registry=REGISTRY,
)

# Delivery as an obligation (seed 004): the delivery pump.
PUMP_LAG_SECONDS = Gauge(
    "treemail_pump_lag_seconds",
    "How long the oldest obligation had been due when the pump's last pass began (0: none overdue)",
    registry=REGISTRY,
)
PUMP_PASSES = Counter("treemail_pump_passes", "Delivery pump passes over the due index", registry=REGISTRY)
OBLIGATIONS = Counter(
    "treemail_obligations", "What the delivery pump did: released (attempt timeout), parked, woken",
    ["action"], registry=REGISTRY,
)


def start_server(port: int, what: str, *, free_port_if_taken: bool = False) -> WSGIServer:
    """Serve this process's metrics from a daemon thread; ``server.server_address[1]`` is the port.

    ``free_port_if_taken`` is for a port nobody chose (the default): several
    workers started on one host without ports must not crash on the second
    bind, so the later ones serve on a free port and log it. A port an
    operator asked for is never silently replaced.
    """
    try:
        server, _ = start_http_server(port, registry=REGISTRY)
    except OSError as exc:
        if not (free_port_if_taken and exc.errno == errno.EADDRINUSE):
            raise ConfigError(f"{what} metrics: cannot listen on port {port}: {exc.strerror}") from exc
        log.warning("%s metrics: port %d is taken, serving on a free port instead", what, port)
        server, _ = start_http_server(0, registry=REGISTRY)
    log.warning("%s metrics on http://0.0.0.0:%d/metrics", what, server.server_address[1])
    return server


def stop_server(server: WSGIServer) -> None:
    server.shutdown()
    server.server_close()


def serve(port: int, what: str) -> int:
    """Serve this process's metrics; returns the port (a free one when ``port`` is 0)."""
    return start_server(port, what).server_address[1]
