"""The clock every service decides by: read once per decision and handed to the domain as ``now``.

One object, passed to each service where the services are wired, so an
engine's tests can replace it with their own (any object with these two
methods). The domain never reads a clock: it is given the time.
"""

import time
from typing import Protocol


class Clock(Protocol):
    def now(self) -> float:
        """Wall-clock time in epoch seconds: what events record and delivery times are compared with."""

    def monotonic(self) -> float:
        """Seconds that never go back: how long something has been held."""


class SystemClock:
    def now(self) -> float:
        return time.time()

    def monotonic(self) -> float:
        return time.monotonic()


SYSTEM_CLOCK = SystemClock()
