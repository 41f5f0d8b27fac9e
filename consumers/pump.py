"""The delivery pump process: `treemail pump`, or `python -m treemail.consumers.pump`.

A consumer, not a projection: it decides (through the domain's obligation rules) and appends; it keeps no
view.

It keeps every delivery obligation stored in the streams: claims past their
attempt timeout are released (or parked), passed deadlines park, and an idle
or finished session with mail due (after a backoff, or whose wake trigger was
lost) is asked to wake. At start it sweeps every session with pending mail,
which is what ``tm.obligations.reconcile`` does; then, every ``interval_s``, it
takes the sessions whose time has come from each partition's due index.

It is also a peer driver (``services.peerdelivery``): it admits pending
peer intents to their destinations, with attempts, backoff and parking, and
brings receipts and settlements back to their sources.

It proves every accepted message ends: at its start (whose sweep keeps every session with pending mail), then
every ``[messaging] stranded_sweep_s`` of its clock, it looks over every closed session still holding mail (about
``STRANDED_SLICE`` sessions a pass, so a large population's look spreads over passes), and each
message no rule can end any more is reported once (``ProducerMessageStranded`` on its recipient's stream,
which ``inspect`` shows), counted in ``treemail_obligations_total{action="stranded"}`` and logged, instead
of waiting for ever.

It acts only through ``KeepObligations`` (and the peer driver's commands), decided by a pure function and
appended under the session's etag, so pumps scale like workers: run one for
availability, two or more for speed; none ever doubles a release, a park or
a wake. Its lag (how long the oldest due obligation waited for a pass) is
``treemail_pump_lag_seconds``, alerted on in deploy/alerts.yml.

Health, as the worker's: ``/healthz`` while the event loop ticks, ``/readyz``
once the first sweep is done and while the server answers. A pump that
loses its server keeps trying every interval, and logs one line when that
starts failing and one when it works again (a server not there at start is a
clear error, as for every process).
"""

import asyncio
import logging

from treemail.adapters import metrics, tracing
from treemail.adapters.config import Config, load_config
from treemail.adapters.connection import connect
from treemail.adapters.eventstore import EventStore
from treemail.adapters.health import UNREACHABLE, Health, OutageLog
from treemail.adapters.lifecycle import serve_until_signalled
from treemail.domain import events as ev
from treemail.services import bootstrap
from treemail.services.clock import SYSTEM_CLOCK, Clock
from treemail.services.population import SweepPosition

log = logging.getLogger("treemail.pump")

DEFAULT_METRICS_PORT = 9466

# A look for stranded mail reads every registered session's state, and sessions stay registered for good: it
# reads about this many a pass, so a pass (and the due obligations behind it) never waits on the whole
# population (20,000 sessions read at once held a pass up 0.6-1.6 s); the next passes go on with the rest.
STRANDED_SLICE = 1000


class Pump:
    def __init__(self, store: EventStore, config: Config, interval_s: float = 1.0,
                 clock: Clock = SYSTEM_CLOCK) -> None:
        """``clock``: what its decisions and the due index are read by (``treemail.testing`` moves one)."""
        self.store = store
        self.config = config
        self.interval_s = interval_s
        services = bootstrap.pump(store, config, clock)
        self.service = services.obligations
        # Peer mail as an outbox: the pump is also a peer driver (admission attempts, status back).
        self.peer_driver = services.peer_driver
        self.passes = 0
        self.swept = False
        self.clock = clock
        # When, by ``clock``, the next look for stranded mail is due: at the first pass unless ``start`` swept, then
        # every ``stranded_sweep_s``.
        self.stranded_sweep_at = 0.0
        # Where a look for stranded mail spread over passes goes on (None: none under way), and how many
        # sessions' states a pass reads of it.
        self.stranded_from: SweepPosition | None = None
        self.stranded_slice = STRANDED_SLICE
        self.health = Health()
        self.outages = OutageLog(log)

    async def probe(self) -> str | None:
        await self.store.redis.ping()
        return None if self.swept else "sweeping the sessions with pending mail"

    async def start(self) -> int:
        """The first pass: every session with pending mail, whatever the due index says. Returns sessions seen."""
        await self.store.load_scripts()
        swept = await self.service.sweep()
        log.info("pump swept %d sessions with pending mail; %d events", swept.sessions, len(swept.events))
        await self.peer_driver.sweep()
        self.swept = True
        self.stranded_sweep_at = self.clock.now() + self.config.messaging.stranded_sweep_s  # the sweep kept every session with mail
        return swept.sessions

    async def step(self) -> int:
        return len(await self.run_pass())

    async def run_pass(self) -> list[ev.Event]:
        """One pass of every timed rule at the clock's present reading: the delivery obligations due by now,
        then the peer deliveries due by now (attempts, backoff, parking, settlement), and when its time has
        come the look for stranded mail. Returns the events appended, which is what ``treemail.testing`` hands
        a test."""
        done = await self.service.step()
        driven = await self.peer_driver.step()
        events = done.events + driven.events
        if self.stranded_from is not None or self.clock.now() >= self.stranded_sweep_at:
            swept, self.stranded_from = await self.service.sweep_stranded(self.stranded_from or SweepPosition(),
                                                                          self.stranded_slice)
            events += swept.events
            if self.stranded_from is None:
                self.stranded_sweep_at = self.clock.now() + self.config.messaging.stranded_sweep_s
        self.passes += 1
        return events

    async def run(self, stopping: asyncio.Event) -> None:
        while not stopping.is_set():
            try:
                if not self.swept:
                    await self.start()
                await self.step()
                self.outages.ok("pump pass")
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # noqa: BLE001 - a failed pass (a server blip) is retried at the next interval
                self.outages.failed("server" if isinstance(exc, UNREACHABLE) else "pump pass", exc)
            try:
                await asyncio.wait_for(stopping.wait(), self.interval_s)
            except asyncio.TimeoutError:
                pass


async def serve_pump(config: Config, url: str, metrics_port: int | None = None, interval_s: float = 1.0) -> None:
    """Run one pump until SIGINT/SIGTERM. ``metrics_port``: None or negative serves none, 0 a free port."""
    tracing.configure_from_env()
    redis = await connect(url, config.service)
    pump = Pump(EventStore(redis, config.service), config, interval_s)
    stopping = asyncio.Event()
    await serve_until_signalled(
        redis, lambda: pump.run(stopping), stopping, health=pump.health, probe=pump.probe, outages=pump.outages,
        what="pump", registry=metrics.PUMP_REGISTRY, metrics_port=metrics_port,
    )


def main() -> None:
    """`python -m treemail.consumers.pump`: configuration from TREEMAIL_CONFIG and the environment."""
    import os

    logging.basicConfig(level=os.environ.get("TREEMAIL_LOG", "WARNING"), format="%(asctime)s %(name)s %(message)s")
    config = load_config()
    if not config.service.redis_url:
        raise SystemExit("treemail pump: error: no server: set REDIS_URL (or [service] redis_url in TREEMAIL_CONFIG); "
                         "`treemail server` starts a local Valkey and prints the URL")
    port = int(os.environ.get("TREEMAIL_PUMP_METRICS_PORT", str(DEFAULT_METRICS_PORT)))
    interval = float(os.environ.get("TREEMAIL_PUMP_INTERVAL_S", "1.0"))
    asyncio.run(serve_pump(config, config.service.redis_url, port, interval))


if __name__ == "__main__":
    main()
