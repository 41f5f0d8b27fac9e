"""Liveness, readiness and outage logging for the long-running processes (workers, projection workers).

A process is *alive* while its event loop keeps ticking (``/healthz``) and
*ready* while its last probe of the server passed (``/readyz``): the server
answered and what the process reads from is there (the worker's consumer
group). The probe runs every ``interval_s`` with a deadline, so readiness
turns false within a few seconds of losing the server and true again soon
after it returns.

During an outage every loop of a process fails at once, every few hundred
milliseconds; logging each failure with its traceback buried the one line
that mattered (about 240 traceback lines in 25 s from one worker).
``OutageLog`` logs one line when something starts failing and one when it
works again.
"""

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable

from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import ResponseError as RedisResponseError
from redis.exceptions import TimeoutError as RedisTimeoutError

from ..domain.errors import TreemailError

# Failures that mean "the server is not there", not "this code is wrong": no traceback for these.
UNREACHABLE = (RedisConnectionError, RedisTimeoutError, ConnectionError, TimeoutError, OSError)


class NotReady(TreemailError):
    """The server answers, but what the process reads from is not there (yet)."""

    code = "server:not_ready"


def expected(exc: BaseException) -> bool:
    """A state of the world (server gone, or back without its data), not a bug: no traceback for it."""
    if isinstance(exc, (*UNREACHABLE, NotReady)):
        return True
    return isinstance(exc, RedisResponseError) and str(exc).startswith("NOGROUP")


def describe(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


class OutageLog:
    """One log line per change of state, per subject; never one per retry."""

    def __init__(self, log: logging.Logger) -> None:
        self.log = log
        self._failing: dict[str, str] = {}

    def failed(self, subject: str, exc: BaseException) -> bool:
        """Record a failure; returns True when this one was logged (the subject was working until now).

        Not once per kind of failure: through a network partition the probe
        times out while other loops see resets, alternating every second.
        """
        if subject in self._failing:
            return False
        self._failing[subject] = type(exc).__name__
        # A bug (not an outage) keeps its traceback, once.
        self.log.warning("%s failing: %s", subject, describe(exc), exc_info=not expected(exc))
        return True

    def ok(self, subject: str) -> None:
        if self._failing.pop(subject, None) is not None:
            self.log.warning("%s working again", subject)

    def failing(self, subject: str) -> bool:
        return subject in self._failing


class Health:
    """What /healthz and /readyz answer; written by the process's loop, read by the HTTP thread."""

    def __init__(self, stale_after_s: float = 30.0) -> None:
        self.stale_after_s = stale_after_s
        self.ready = False
        self.reason = "starting"
        self._beat = time.monotonic()

    def beat(self) -> None:
        self._beat = time.monotonic()

    def set(self, ready: bool, reason: str) -> None:
        self.ready, self.reason = ready, reason
        self.beat()

    def alive(self) -> tuple[bool, str]:
        age = time.monotonic() - self._beat
        if age > self.stale_after_s:
            return False, f"event loop silent for {age:.0f} s"
        return True, "alive"

    def readiness(self) -> tuple[bool, str]:
        alive, why = self.alive()
        if not alive:
            return False, why
        return self.ready, self.reason


Probe = Callable[[], Awaitable[str | None]]


async def watch(
    health: Health, probe: Probe, outages: OutageLog, stopping: Callable[[], bool], *, interval_s: float = 1.0,
    deadline_s: float = 2.0, subject: str = "server",
) -> None:
    """Probe until ``stopping()``: a probe returns None when ready, or why not; raising means unreachable.

    Not ready before the first ready probe is starting up, not news; after
    it, every change is logged once.
    """
    been_ready = False
    while not stopping():
        try:
            why = await asyncio.wait_for(probe(), deadline_s)
        except asyncio.CancelledError:
            raise
        except asyncio.TimeoutError:
            why = f"no answer within {deadline_s:g} s"
            outages.failed(subject, TimeoutError(why))
        except Exception as exc:  # noqa: BLE001 - whatever the probe hit, the process is not ready
            why = describe(exc)
            outages.failed(subject, exc)
        else:
            if why is None:
                outages.ok(subject)
                been_ready = True
            elif been_ready:
                outages.failed(subject, NotReady(why))
        health.set(why is None, why or "ready")
        await asyncio.sleep(interval_s)
