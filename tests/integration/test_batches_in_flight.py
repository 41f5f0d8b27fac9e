"""A worker reads a command stream's next batch while one waits for the server (``batches_in_flight``), up to
its bound, and a stopping worker finishes the batches it holds."""

import asyncio

from treemail.adapters import keys
from treemail.consumers.app import Worker
from treemail.host import Treemail

from .conftest import adapters, close_host, connect_host, make_config

HELD_MS = 500  # long enough for several of FastStream's 100 ms polls


def one_stream_config(redis_url: str, batches_in_flight: int, exclusive: bool = True):
    config = make_config(redis_url)
    # Reclaim would take a held batch over (it is pending past reclaim_idle_ms) and decide it again.
    service = config.service.model_copy(update={"command_streams": 1, "batches_in_flight": batches_in_flight,
                                                "reclaim_idle_ms": 60_000, "exclusive_streams": exclusive})
    return config.model_copy(update={"service": service})


class Gate:
    """Holds the decision of every batch with a body starting "hold" until opened; records what entered."""

    def __init__(self, worker: Worker) -> None:
        self.entered: list[str] = []
        self.open = asyncio.Event()
        decide = worker.decider.decide

        async def gated(commands, acknowledge=None):
            self.entered.extend(c.arguments.body for c in commands)
            if any(c.arguments.body.startswith("hold") for c in commands):
                await self.open.wait()
            return await decide(commands, acknowledge)

        worker.decider.decide = gated

    async def until_entered(self, body: str) -> None:
        await until(lambda: body in self.entered)


async def until(condition, seconds: float = 10) -> None:
    async with asyncio.timeout(seconds):
        while not condition():
            await asyncio.sleep(0.02)


async def started(redis_url: str, batches_in_flight: int, alone: bool = True, exclusive: bool = True
                  ) -> tuple[Treemail, Worker, Gate, object, object]:
    config = one_stream_config(redis_url, batches_in_flight, exclusive)
    worker = Worker(config, redis_url, consumer="in-flight")
    await worker.start()
    if alone:  # it owns the stream, or (streams shared) the health probe has found no other worker reading it
        await until(lambda: keys.command_stream(0) in worker.in_flight.read_alone)
    host = await connect_host(config, redis_url)
    root = await host.register_root("planner", "plans", rules={"child": "allow"})
    child = await host.register_child(root.session_id, "explore", "reads", rules={"parent": "allow"})
    await host.start_run(root.session_id, "run-1")
    return host, worker, Gate(worker), root, child


def sending(host: Treemail, calls, root, child, body: str) -> asyncio.Task:
    return asyncio.create_task(host.send_message(calls.ctx(root.session_id), {"to": child.handle, "body": body}))


async def takes_one_batch_at_a_time(host: Treemail, gate: Gate, calls, root, child) -> None:
    """While a batch is held, the next command is not even read; both are decided once it goes on."""
    first = sending(host, calls, root, child, "hold-1")
    await gate.until_entered("hold-1")
    second = sending(host, calls, root, child, "free-2")
    await asyncio.sleep(HELD_MS / 1000)
    assert gate.entered == ["hold-1"]

    gate.open.set()
    results = await asyncio.gather(first, second)
    assert all("message_id" in r for r in results), results


async def test_the_next_batch_is_decided_while_one_waits_and_no_more_than_the_bound(redis_url, calls):
    host, worker, gate, root, child = await started(redis_url, batches_in_flight=2)
    try:
        first = sending(host, calls, root, child, "hold-1")
        await gate.until_entered("hold-1")
        second = sending(host, calls, root, child, "hold-2")
        await gate.until_entered("hold-2")  # read and decided while the first batch is still in hand

        third = sending(host, calls, root, child, "free-3")
        await asyncio.sleep(HELD_MS / 1000)
        assert "free-3" not in gate.entered  # both slots taken: not even read

        gate.open.set()
        results = await asyncio.gather(first, second, third)
        assert all("message_id" in r for r in results), results
        assert gate.entered == ["hold-1", "hold-2", "free-3"]
        assert (await adapters(host).redis.xpending(keys.command_stream(0), keys.COMMAND_GROUP))["pending"] == 0
        assert len(await host.obligations.pending_mail(child.session_id)) == 3
    finally:
        gate.open.set()
        await close_host(host)
        await worker.stop()


async def test_with_one_batch_in_flight_the_next_waits_for_it(redis_url, calls):
    host, worker, gate, root, child = await started(redis_url, batches_in_flight=1, alone=False)
    assert worker.in_flight.read_alone == frozenset()  # not even looked for
    try:
        await takes_one_batch_at_a_time(host, gate, calls, root, child)
    finally:
        gate.open.set()
        await close_host(host)
        await worker.stop()


async def test_a_stopping_worker_finishes_the_batches_in_flight(redis_url, calls):
    host, worker, gate, root, child = await started(redis_url, batches_in_flight=2)
    stopping = None
    try:
        first = sending(host, calls, root, child, "hold-1")
        await gate.until_entered("hold-1")
        stopping = asyncio.create_task(worker.stop())
        await asyncio.sleep(HELD_MS / 1000)
        assert not stopping.done()  # it waits for the batch in hand

        gate.open.set()
        await asyncio.wait_for(stopping, 10)
        assert "message_id" in await asyncio.wait_for(first, 10)
        assert (await adapters(host).redis.xpending(keys.command_stream(0), keys.COMMAND_GROUP))["pending"] == 0
    finally:
        gate.open.set()
        await close_host(host)
        if stopping is None:
            await worker.stop()
        else:
            await stopping


async def test_a_worker_that_shares_the_stream_with_another_takes_one_batch_at_a_time(redis_url, calls):
    # Streams shared (``exclusive_streams`` off): whether another worker reads it is seen by the health probe.
    host, worker, gate, root, child = await started(redis_url, batches_in_flight=2, exclusive=False)
    stream = keys.command_stream(0)
    neighbour_polls = True

    async def neighbour() -> None:
        # Another worker of the group polling the stream (it reads its own pending entries: it takes none).
        while neighbour_polls:
            await adapters(host).redis.xreadgroup(keys.COMMAND_GROUP, "neighbour", {stream: "0"}, count=1)
            await asyncio.sleep(0.1)

    polling = asyncio.create_task(neighbour())
    try:
        await until(lambda: stream not in worker.in_flight.read_alone)
        await takes_one_batch_at_a_time(host, gate, calls, root, child)
    finally:
        neighbour_polls = False
        await polling
        gate.open.set()
        await close_host(host)
        await worker.stop()


async def test_a_worker_whose_held_states_others_keep_changing_takes_one_batch_at_a_time(redis_url, calls):
    host, worker, gate, root, child = await started(redis_url, batches_in_flight=2)
    try:
        worker.decider.held.contended(conflicted=10, appended=10)  # as after a batch that mostly conflicted
        await takes_one_batch_at_a_time(host, gate, calls, root, child)
    finally:
        gate.open.set()
        await close_host(host)
        await worker.stop()
