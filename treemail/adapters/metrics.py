"""Prometheus metrics and health endpoints of worker and projection processes.

Each process serves one HTTP port (``treemail worker --metrics-port``, or
TREEMAIL_METRICS_PORT; 0 picks a free one and logs it) with ``/metrics``,
``/healthz`` (alive) and ``/readyz`` (ready: server reachable, what it reads
is there), so several processes on one host never clash and no
multiprocess directory is needed. A worker exports only the worker
registry and a projection worker only the projection registry: a worker
showing projection gauges frozen at 0 made dashboards lie. Labels are
bounded: outcome codes, command streams, projections, partitions, never
sessions or trees. Counters are created at 0 for every label value known
in advance, so a dashboard shows 0, not "No data", before the first event.

A little over the house's 200 lines: every metric of every process in one registry module.
"""

import errno
import logging
import socketserver
import threading
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, ProcessCollector, make_wsgi_app

from ..domain.errors import Code, ConfigError
from ..domain.events import ProducerMessageSteerFellBack
from .health import Health

log = logging.getLogger("treemail.metrics")

WORKER_REGISTRY = CollectorRegistry(auto_describe=True)
PROJECTION_REGISTRY = CollectorRegistry(auto_describe=True)
PUMP_REGISTRY = CollectorRegistry(auto_describe=True)
# What the embedding engine's own process counts (source proofs, settlement notices): it serves it with
# ``start_server(port, "host", HOST_REGISTRY)`` if it wants it scraped.
HOST_REGISTRY = CollectorRegistry(auto_describe=True)
for _registry in (WORKER_REGISTRY, PROJECTION_REGISTRY, PUMP_REGISTRY, HOST_REGISTRY):
    # CPU, memory and file descriptors of the process: a worker that leaks or spins shows here first.
    ProcessCollector(registry=_registry)

# -- workers -------------------------------------------------------------------------------

SENDS = Counter(
    "treemail_sends", "send_message decisions by outcome (ok, or the error code)", ["outcome"],
    registry=WORKER_REGISTRY,
)
SEND_OUTCOMES = ("ok", "approval_pending", *(code.value for code in Code))
DECISION_SECONDS = Histogram(
    "treemail_decision_seconds",
    "Time from reading a command batch to its decisions being durable, per command",
    buckets=(0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5),
    registry=WORKER_REGISTRY,
)
BATCH_SIZE = Histogram(
    "treemail_batch_size", "Commands per batch a worker decided", buckets=(1, 2, 5, 10, 25, 50, 100, 250, 500, 1000),
    registry=WORKER_REGISTRY,
)
CONFLICT_ROUNDS = Counter(
    "treemail_conflict_retries", "Commands decided again after another writer appended first",
    registry=WORKER_REGISTRY,
)
HELD_ROUNDS = Counter(
    "treemail_held_rounds",
    "Rounds of a batch by the states they were decided on: held (no read), fresh (read: something was "
    "not held), or discarded (decided on held states, then again on a fresh read)",
    ["reads"], registry=WORKER_REGISTRY,
)
COMMAND_BACKLOG = Gauge(
    "treemail_command_backlog", "Commands not yet read by the worker group (lag)", ["stream"],
    registry=WORKER_REGISTRY,
)
COMMAND_PENDING = Gauge(
    "treemail_command_pending", "Commands read but not acknowledged (pending entries)", ["stream"],
    registry=WORKER_REGISTRY,
)
WORKER_CONSUMERS = Gauge(
    "treemail_worker_consumers", "Consumers of the worker group seen active recently (0 while the server is "
    "unreachable)", ["stream"], registry=WORKER_REGISTRY,
)
WORKERS_LIVE = Gauge(
    "treemail_workers_live", "Workers in the members set that shares the command streams out (0 while the server "
    "is unreachable)", registry=WORKER_REGISTRY,
)
DEAD_LETTERS = Counter(
    "treemail_dead_letters", "Commands moved to the dead-letter stream", ["reason"], registry=WORKER_REGISTRY
)
DEAD_LETTER_REASONS = ("malformed", "invalid", "newer_protocol", "max_deliveries")
APPROVALS_PENDING = Gauge(
    "treemail_approvals_pending", "Approval requests waiting for a person", registry=WORKER_REGISTRY
)

for _outcome in SEND_OUTCOMES:
    SENDS.labels(_outcome)
for _reason in DEAD_LETTER_REASONS:
    DEAD_LETTERS.labels(_reason)
for _reads in ("held", "fresh", "discarded"):
    HELD_ROUNDS.labels(_reads)

# -- projection workers --------------------------------------------------------------------

PROJECTION_EVENTS = Counter(
    "treemail_projection_events", "Events folded into projections", ["projection"], registry=PROJECTION_REGISTRY
)
PROJECTION_LAG_EVENTS = Gauge(
    "treemail_projection_lag_events", "Feed entries not yet folded", ["projection", "partition"],
    registry=PROJECTION_REGISTRY,
)
PROJECTION_LAG_SECONDS = Gauge(
    "treemail_projection_lag_seconds", "Age of the oldest feed entry not yet folded", ["projection", "partition"],
    registry=PROJECTION_REGISTRY,
)
PENDING_INBOX = Gauge(
    "treemail_pending_agent_mail", "Pending agent mail over all sessions", registry=PROJECTION_REGISTRY
)
FULL_INBOXES = Gauge(
    "treemail_full_inboxes", "Sessions whose pending agent mail reached max_pending_per_session",
    registry=PROJECTION_REGISTRY,
)
INFLIGHT_PAIRS = Gauge(
    "treemail_inflight_pairs", "Directed pairs with unacknowledged agent mail", registry=PROJECTION_REGISTRY
)
FULL_WINDOWS = Gauge(
    "treemail_full_windows", "Directed pairs whose window reached max_inflight_per_pair",
    registry=PROJECTION_REGISTRY,
)
WAKES = Counter("treemail_wakes", "Wake requests emitted", registry=PROJECTION_REGISTRY)
WAKES_OUTSTANDING = Gauge(
    "treemail_wakes_outstanding", "Sessions with a wake requested and no run started yet",
    registry=PROJECTION_REGISTRY,
)
# Settlement notices: counted in the process that disposes or finishes the child (the host's), never failing either.
SETTLEMENT_FAILURES = Counter(
    "treemail_settlement_notice_failures", "Settlement notices that could not be delivered to a parent",
    registry=HOST_REGISTRY,
)

# Delivery as an obligation: the delivery pump.
PUMP_LAG_SECONDS = Gauge(
    "treemail_pump_lag_seconds",
    "How long the oldest obligation had been due when the pump's last pass began (0: none overdue)",
    registry=PUMP_REGISTRY,
)
PUMP_PASSES = Counter("treemail_pump_passes", "Delivery pump passes over the due index", registry=PUMP_REGISTRY)
OBLIGATIONS = Counter(
    "treemail_obligations", "What the delivery pump did: released (attempt timeout), parked, woken, stranded "
    "(reported a message no rule can end any more), disposal_completed (a disposal its host left after the "
    "cutoff)", ["action"], registry=PUMP_REGISTRY,
)
for _action in ("released", "parked", "woken", "stranded", "disposal_completed"):
    OBLIGATIONS.labels(_action)
# A run that ended with mail due in it unconsumed (claimed and not acknowledged, or never claimed: a woken
# run whose provider failed): counted in the host process that finishes the run, by what became of the mail.
FAILED_ATTEMPTS = Counter(
    "treemail_failed_delivery_attempts",
    "Failed delivery attempts at the end of a run: released (backing off) with reason run_finished (claimed, "
    "never acknowledged) or wake_unclaimed (never claimed), or parked with reason max_attempts or deadline",
    ["reason", "outcome"], registry=HOST_REGISTRY,
)

# Flow control: steer mail that fell back to queue, by reason. The pump counts the deadlines it acts on; the host
# process counts what its releases (the boundary limit) and its run finishes (run_finished) decide.
_STEER_HELP = "Steer mail that fell back to queue: deadline, boundaries or run_finished"
STEER_FALLBACKS = Counter("treemail_steer_fallbacks", _STEER_HELP, ["reason"], registry=PUMP_REGISTRY)
HOST_STEER_FALLBACKS = Counter("treemail_steer_fallbacks", _STEER_HELP, ["reason"], registry=HOST_REGISTRY)
for _reason in ("deadline", "boundaries", "run_finished"):
    STEER_FALLBACKS.labels(_reason)
    HOST_STEER_FALLBACKS.labels(_reason)


def count_steer_fallbacks(events, counter: Counter = HOST_STEER_FALLBACKS) -> None:
    for event in events:
        if isinstance(event, ProducerMessageSteerFellBack):
            counter.labels(event.reason).inc()


def known_projections(names: list[str]) -> None:
    """Projection names live above this layer: the projection worker names them at start."""
    for name in names:
        PROJECTION_EVENTS.labels(name)


# -- the HTTP endpoint ---------------------------------------------------------------------


class _Server(socketserver.ThreadingMixIn, WSGIServer):
    daemon_threads = True
    block_on_close = False  # a scraper that hangs must not hold up the process's exit


class _Quiet(WSGIRequestHandler):
    def log_message(self, format, *args):  # noqa: A002 - the base class's name
        pass  # a scrape every few seconds is not news


def _app(registry: CollectorRegistry, health: Health | None):
    metrics_app = make_wsgi_app(registry)

    def app(environ, start_response):
        path = environ.get("PATH_INFO", "/")
        if path in ("/healthz", "/readyz"):
            if health is None:
                ok, why = True, "no probe"
            else:
                ok, why = health.alive() if path == "/healthz" else health.readiness()
            start_response("200 OK" if ok else "503 Service Unavailable",
                           [("Content-Type", "text/plain; charset=utf-8")])
            return [f"{why}\n".encode()]
        return metrics_app(environ, start_response)

    return app


def _listen(port: int, app) -> WSGIServer:
    return make_server("0.0.0.0", port, app, _Server, handler_class=_Quiet)


def start_server(
    port: int, what: str, registry: CollectorRegistry, health: Health | None = None, *,
    free_port_if_taken: bool = False,
) -> WSGIServer:
    """Serve /metrics, /healthz and /readyz from a daemon thread; ``server.server_address[1]`` is the port.

    ``free_port_if_taken`` is for a port nobody chose (the default): several
    workers started on one host without ports must not crash on the second
    bind, so the later ones serve on a free port and log it. A port an
    operator asked for is never silently replaced.
    """
    app = _app(registry, health)
    moved = False
    try:
        server = _listen(port, app)
    except OSError as exc:
        if not (free_port_if_taken and exc.errno == errno.EADDRINUSE):
            raise ConfigError(f"{what} metrics: cannot listen on port {port}: {exc.strerror}") from exc
        server, moved = _listen(0, app), True
    threading.Thread(target=server.serve_forever, name=f"treemail-metrics-{port}", daemon=True).start()
    actual = server.server_address[1]
    if moved:
        log.warning("%s metrics: port %d is taken, serving on http://0.0.0.0:%d/metrics instead", what, port, actual)
    elif port == 0:
        # Nobody can guess a free port: say which.
        log.warning("%s metrics on http://0.0.0.0:%d/metrics", what, actual)
    else:
        log.info("%s metrics on http://0.0.0.0:%d/metrics", what, actual)
    return server


def stop_server(server: WSGIServer) -> None:
    server.shutdown()
    server.server_close()
