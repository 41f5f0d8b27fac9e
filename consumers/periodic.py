"""How a worker's background loops run and report: a step every interval, bounded, reported once per change.

During an outage a loop logs one line per change of state (``OutageLog``), not a traceback per retry.
"""

import asyncio
from collections.abc import Awaitable, Callable

from redis.exceptions import TimeoutError as RedisTimeoutError

from treemail.adapters.health import UNREACHABLE, OutageLog

# The periodic passes (reclaim, trim, stats) run on the worker's connection, which has no timer per
# reply: each pass as a whole gives up after this long and is tried again at the next interval.
PASS_DEADLINE_S = 60.0


def report_failure(outages: OutageLog, subject: str, exc: Exception) -> None:
    # Lost connections are the health probe's to report, once, as the server's state.
    outages.failed("server" if isinstance(exc, UNREACHABLE) else subject, exc)


async def every(interval_s: float, deadline_s: float, subject: str, step: Callable[[], Awaitable[object]],
                stopping: Callable[[], bool], outages: OutageLog) -> None:
    """``step`` every ``interval_s`` until ``stopping()``. One that fails or takes over ``deadline_s`` is
    reported (once per change of state) and tried again at the next interval."""
    # The flag, not only cancellation, ends the loop: a client library that swallows a
    # CancelledError mid-command must not keep a stopping worker alive.
    while not stopping():
        await asyncio.sleep(interval_s)
        if stopping():
            return
        try:
            async with asyncio.timeout(deadline_s):
                await step()
            outages.ok(subject)
        except asyncio.CancelledError:
            raise
        except TimeoutError:
            report_failure(outages, subject, RedisTimeoutError(f"{subject} not done within {deadline_s:g} s"))
        except Exception as exc:  # noqa: BLE001 - tried again at the next interval
            report_failure(outages, subject, exc)
