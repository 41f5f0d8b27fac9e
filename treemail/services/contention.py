"""Rounds of decide-and-append on one session, for every service that appends under an etag.

An append conflicts when the session changed after the state it was decided
on was read; the caller then decides again on the newer state. Writers
retrying on one session at once would collide in lockstep, so each round
after the first starts after a random pause that grows with the round (up to
20 ms). After ``ATTEMPTS`` rounds the session is given up on with
``lifecycle:contention``.

The rounds are tenacity's: the caller leaves the loop once its append applied,
and every round it comes back for counts as a failed attempt.
"""

import random
from collections.abc import AsyncIterator

from tenacity import AsyncRetrying, RetryCallState, RetryError, retry_always, stop_after_attempt

from ..domain.errors import LifecycleError

ATTEMPTS = 200


def _jittered(state: RetryCallState) -> float:
    """Before round n (counted from 0): a pause drawn from 0 to min(n, 20) ms."""
    return random.uniform(0, 0.001 * min(state.attempt_number, 20))


async def rounds(session_id: str, attempts: int = ATTEMPTS) -> AsyncIterator[int]:
    """``async for attempt in rounds(session_id):`` decide, append, and return once the append applied."""
    retrying = AsyncRetrying(stop=stop_after_attempt(attempts), wait=_jittered, retry=retry_always)
    try:
        async for attempt in retrying:
            yield attempt.retry_state.attempt_number - 1
            # Back for another round: this one's append did not apply.
            attempt.retry_state.set_result(None)
    except RetryError:
        raise LifecycleError(
            "lifecycle:contention", f"session {session_id} kept changing under {attempts} attempts"
        ) from None
