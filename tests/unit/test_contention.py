"""Rounds of decide-and-append on one session: every service that appends under an etag retries through them."""

import time

import pytest

from treemail.domain.errors import LifecycleError
from treemail.services import contention


async def test_rounds_give_up_with_lifecycle_contention_after_their_attempts():
    seen = []
    started = time.monotonic()
    with pytest.raises(LifecycleError) as raised:
        async for attempt in contention.rounds("session-1", attempts=4):
            seen.append(attempt)
    assert seen == [0, 1, 2, 3]
    assert raised.value.code == "lifecycle:contention"
    assert "session session-1 kept changing under 4 attempts" in str(raised.value)
    assert time.monotonic() - started < 1  # pauses of at most a few milliseconds each


async def test_a_round_that_returns_ends_the_rounds_without_an_error():
    async def applied_on_the_third_round() -> int:
        async for attempt in contention.rounds("session-1"):
            if attempt == 2:
                return attempt
        raise AssertionError("unreachable: the rounds either return or raise")

    assert await applied_on_the_third_round() == 2
