"""The bound on batches in hand, per command stream, and finishing them (``consumers.inflight``)."""

import asyncio

from treemail.consumers.inflight import BatchesInFlight


def test_only_a_stream_read_alone_takes_batches_in_flight_and_only_with_a_bound_above_one():
    two, one = BatchesInFlight(2), BatchesInFlight(1)
    two.read_alone = one.read_alone = frozenset({"cmd:0"})

    assert two.may_take("cmd:0")
    assert not two.may_take("cmd:1")
    assert not one.may_take("cmd:0")


async def test_a_stream_has_at_most_its_bound_in_hand_and_another_stream_its_own():
    in_flight = BatchesInFlight(2)
    release = asyncio.Event()
    started: list[str] = []

    def batch(name: str):
        async def run() -> None:
            started.append(name)
            await release.wait()
        return run

    await in_flight.take("cmd:0", batch("a1"))
    await in_flight.take("cmd:0", batch("a2"))
    assert started == ["a1", "a2"]  # each ran up to its first wait before take returned
    third = asyncio.create_task(in_flight.take("cmd:0", batch("a3")))
    await in_flight.take("cmd:1", batch("b1"))
    await asyncio.sleep(0.05)
    assert started == ["a1", "a2", "b1"] and not third.done()

    release.set()
    await third
    await in_flight.finish(timeout=5)
    assert started == ["a1", "a2", "b1", "a3"]


async def test_finish_waits_for_the_batches_in_hand_and_gives_up_after_its_timeout():
    in_flight = BatchesInFlight(2)
    release = asyncio.Event()
    done: list[str] = []

    async def held() -> None:
        await release.wait()
        done.append("held")

    await in_flight.take("cmd:0", held)
    await in_flight.finish(timeout=0.05)
    assert done == []  # still in hand after the timeout

    release.set()
    await in_flight.finish(timeout=5)
    assert done == ["held"]
