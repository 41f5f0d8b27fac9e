"""Rounds of decide-and-append on one session, for every service that appends under an etag.

An append conflicts when the session changed after the state it was decided
on was read; the caller then decides again on the newer state. Writers
retrying on one session at once would collide in lockstep, so each round
after the first starts after a random pause that grows with the round (up to
20 ms). After ``ATTEMPTS`` rounds the session is given up on with
``lifecycle:contention``.
"""

import asyncio
import random
from collections.abc import AsyncIterator

from ..domain.errors import LifecycleError

ATTEMPTS = 200


async def rounds(session_id: str, attempts: int = ATTEMPTS) -> AsyncIterator[int]:
    """``async for attempt in rounds(session_id):`` decide, append, and return once the append applied."""
    for attempt in range(attempts):
        if attempt:
            await asyncio.sleep(random.uniform(0, 0.001 * min(attempt, 20)))
        yield attempt
    raise LifecycleError("lifecycle:contention", f"session {session_id} kept changing under {attempts} attempts")
