"""bench.roundtrip.paced: the load generator of the latency rows, on a bare event loop (no server)."""

import asyncio
import gc
import weakref

from bench import roundtrip


def test_every_call_is_made_and_timed_and_failures_are_kept_apart():
    async def send(i: int) -> dict:
        await asyncio.sleep(0)
        return {"message_id": str(i)} if i % 10 else {"error": {"code": "x"}}

    run = asyncio.run(roundtrip.paced(2000, 50, send))
    assert len(run["latencies"]) == 45 and len(run["failures"]) == 5
    assert len(run["lateness"]) == 50 and run["elapsed"] > 0


def test_finished_calls_are_not_held_while_the_run_goes_on():
    # Holding every finished call grew the generator's heap by one task per send; its full garbage
    # collections then stalled the calls in flight and set the p99 it measured (BENCHMARKS.md).
    first: list[weakref.ref] = []
    alive_at_the_end: list[bool] = []

    async def send(i: int) -> dict:
        if i == 0:
            first.append(weakref.ref(asyncio.current_task()))
        if i == 199:
            gc.collect()
            alive_at_the_end.append(first[0]() is not None)
        return {"message_id": str(i)}

    run = asyncio.run(roundtrip.paced(5000, 200, send))
    assert len(run["latencies"]) == 200
    assert alive_at_the_end == [False]
