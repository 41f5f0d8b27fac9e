"""Each command stream is read by one live worker at a time (``consumers/ownership.py``): workers share the
streams out, a stopping worker hands its streams over at once and a killed one after ``worker_timeout_ms``,
and what a worker read of a stream it gives up is decided then, not left for reclaim a minute later."""

import asyncio
import os
import signal
import subprocess
import sys

import pytest

from treemail.adapters import keys
from treemail.consumers.app import Worker
from treemail.host import Treemail

from ..conftest import backend_env
from .conftest import WORKER_ENV, adapters, close_host, connect_host, make_config, wait_for_workers

pytestmark = pytest.mark.cluster

STREAMS = 4
EVERY = frozenset(range(STREAMS))


def config_for(redis_url: str, **service):
    config = make_config(redis_url)
    update = {"command_streams": STREAMS, **service}
    return config.model_copy(update={"service": config.service.model_copy(update=update)})


async def until(condition, seconds: float = 10) -> None:
    async with asyncio.timeout(seconds):
        while not condition():
            await asyncio.sleep(0.02)


async def pending(host: Treemail, stream: int) -> int:
    return (await adapters(host).redis.xpending(keys.command_stream(stream), keys.COMMAND_GROUP))["pending"]


async def until_length(host: Treemail, stream: int, length: int) -> None:
    async with asyncio.timeout(10):
        while await adapters(host).redis.xlen(keys.command_stream(stream)) < length:
            await asyncio.sleep(0.02)


async def senders_on(host: Treemail, streams) -> dict[int, tuple]:
    """A root (with a child to send to) whose commands go to each of ``streams``."""
    found: dict[int, tuple] = {}
    while len(found) < len(streams):
        root = await host.register_root("planner", "plans", rules={"child": "allow"})
        index = keys.command_shard(root.session_id, STREAMS)
        if index in streams and index not in found:
            child = await host.register_child(root.session_id, "explore", "reads", rules={"parent": "allow"})
            await host.start_run(root.session_id, "run-1")
            found[index] = (root, child)
    return found


async def send_on_every_stream(host: Treemail, calls, senders: dict[int, tuple]) -> list[dict]:
    return await asyncio.wait_for(asyncio.gather(*[
        host.send_message(calls.ctx(root.session_id), {"to": child.handle, "body": f"on stream {index}"})
        for index, (root, child) in senders.items()
    ]), 20)


@pytest.mark.parametrize("route", ["tree", "sender"])
async def test_a_tree_s_commands_go_to_its_root_s_stream_whoever_sends_them(redis_url, calls, route):
    """Or, routed by sender, each to its sender's own stream."""
    config = config_for(redis_url, route_commands_by=route)
    host = await connect_host(config, redis_url)
    worker = Worker(config, redis_url, consumer="worker-a")
    try:
        root = await host.register_root("planner", "plans", rules={"child": "allow"})
        home = keys.command_shard(root.session_id, STREAMS)
        while True:  # a child whose own id would route it elsewhere
            child = await host.register_child(root.session_id, "explore", "reads", rules={"parent": "allow"})
            own = keys.command_shard(child.session_id, STREAMS)
            if own != home:
                break
        await host.start_run(root.session_id, "run-1")
        await host.start_run(child.session_id, "run-1")
        report = asyncio.create_task(host.send_message(calls.ctx(child.session_id), {"to": root.handle, "body": "found"}))
        steer = asyncio.create_task(host.send_message(calls.ctx(root.session_id), {"to": child.handle, "body": "go"}))
        expected = {home: 2} if route == "tree" else {home: 1, own: 1}
        for stream, length in expected.items():
            await until_length(host, stream, length)
        assert {i: await adapters(host).redis.xlen(keys.command_stream(i)) for i in range(STREAMS)} == {
            i: expected.get(i, 0) for i in range(STREAMS)}

        await worker.start()
        results = await asyncio.wait_for(asyncio.gather(report, steer), 10)
        assert all("message_id" in result for result in results), results
    finally:
        await close_host(host)
        await worker.stop()


async def test_two_workers_share_the_streams_out_and_a_stopping_one_hands_its_share_over_at_once(redis_url, calls):
    config = config_for(redis_url)
    host = await connect_host(config, redis_url)
    a, b = Worker(config, redis_url, consumer="worker-a"), Worker(config, redis_url, consumer="worker-b")
    await a.start()
    try:
        assert a.owned == EVERY  # alone, it reads every stream
        await b.start()
        await until(lambda: a.owned == {0, 2} and b.owned == {1, 3})
        senders = await senders_on(host, EVERY)
        assert all("message_id" in result for result in await send_on_every_stream(host, calls, senders))

        await b.stop()
        # It left the members set as it stopped, so the other takes its streams at its next beat rather than
        # once it would have timed out.
        assert [entry.decode() for entry in await adapters(host).redis.zrange(keys.worker_members(), 0, -1)] == ["4 worker-a"]
        await until(lambda: a.owned == EVERY)
        assert all("message_id" in result for result in await send_on_every_stream(host, calls, senders))
    finally:
        await close_host(host)
        await b.stop()
        await a.stop()


async def test_the_streams_of_a_killed_worker_go_to_the_others_once_it_is_silent_past_the_timeout(redis_url, calls):
    config = config_for(redis_url)
    host = await connect_host(config, redis_url)
    survivor = Worker(config, redis_url, consumer="survivor")
    env = {**os.environ, **WORKER_ENV, **backend_env(), "REDIS_URL": redis_url,
           "TREEMAIL_SERVICE_COMMAND_STREAMS": str(STREAMS)}
    victim = subprocess.Popen([sys.executable, "-m", "treemail", "worker"], env=env, start_new_session=True,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    await survivor.start()
    try:
        await wait_for_workers(redis_url, 2)
        await until(lambda: len(survivor.owned) == STREAMS // 2)
        os.kill(victim.pid, signal.SIGKILL)
        victim.wait()
        killed = asyncio.get_running_loop().time()

        await until(lambda: survivor.owned == EVERY)
        # Not before the victim's last heartbeat is worker_timeout_ms old (it beats every quarter of that).
        assert asyncio.get_running_loop().time() - killed >= config.service.worker_timeout_ms / 1000 * 0.75 - 0.1
        senders = await senders_on(host, EVERY)
        assert all("message_id" in result for result in await send_on_every_stream(host, calls, senders))
    finally:
        if victim.poll() is None:
            victim.kill()
            victim.wait()
        await close_host(host)
        await survivor.stop()


async def held_by(host: Treemail, consumer: str, stream: int, calls, sender: tuple) -> asyncio.Task:
    """A send whose command ``consumer`` has read and not handled: in its pending list, as after a read that
    was on the wire when it stopped reading the stream (FastStream drops that batch)."""
    root, child = sender
    send = asyncio.create_task(host.send_message(calls.ctx(root.session_id), {"to": child.handle, "body": "held"}))
    name = keys.command_stream(stream)
    while await adapters(host).redis.xlen(name) == 0:
        await asyncio.sleep(0.02)
    await adapters(host).redis.xreadgroup(keys.COMMAND_GROUP, consumer, {name: ">"}, count=10)
    return send


async def test_a_worker_that_gives_a_stream_up_decides_what_it_read_of_it(redis_url, calls):
    config = config_for(redis_url, reclaim_idle_ms=60_000)  # reclaim would take a minute
    host = await connect_host(config, redis_url)
    a, b = Worker(config, redis_url, consumer="worker-a"), Worker(config, redis_url, consumer="worker-b")
    try:
        senders = await senders_on(host, {1})
        send = await held_by(host, "worker-a", 1, calls, senders[1])
        await a.start()  # alone, it reads every stream: new commands only, not those it holds
        await asyncio.sleep(0.5)
        assert not send.done()

        await b.start()  # stream 1 is b's now
        assert "message_id" in await asyncio.wait_for(send, 10)
        assert 1 not in a.owned
        # The reply is published before the worker acks the command, so the pending list empties a moment
        # later; well within the minute reclaim would take.
        async with asyncio.timeout(5):
            while await pending(host, 1):
                await asyncio.sleep(0.02)
    finally:
        await close_host(host)
        await b.stop()
        await a.stop()


async def test_a_stopping_worker_decides_what_it_read_and_did_not_handle(redis_url, calls):
    config = config_for(redis_url, reclaim_idle_ms=60_000)
    host = await connect_host(config, redis_url)
    worker = Worker(config, redis_url, consumer="worker-a")
    try:
        senders = await senders_on(host, {2})
        send = await held_by(host, "worker-a", 2, calls, senders[2])
        await worker.start()
        await asyncio.sleep(0.5)
        assert not send.done()

        await worker.stop()
        assert "message_id" in await asyncio.wait_for(send, 10)
    finally:
        await close_host(host)
        await worker.stop()


async def test_with_streams_shared_every_worker_reads_every_stream(redis_url, calls):
    config = config_for(redis_url, exclusive_streams=False)
    host = await connect_host(config, redis_url)
    a, b = Worker(config, redis_url, consumer="worker-a"), Worker(config, redis_url, consumer="worker-b")
    await a.start()
    await b.start()
    try:
        await a.share_streams()  # a beat after b joined
        assert a.owned == b.owned == EVERY
        senders = await senders_on(host, EVERY)
        assert all("message_id" in result for result in await send_on_every_stream(host, calls, senders))
    finally:
        await close_host(host)
        await b.stop()
        await a.stop()
