"""Faults (peer mail as an outbox): a driver killed with kill -9 mid-admission leaves exactly one admission, and the
per-source capacity stays exact with several senders while a worker is killed."""

import asyncio
import os
import signal
import subprocess
import sys
import time

import pytest

from tests.conftest import backend_env
from tests.integration.conftest import WORKER_ENV, adapters, close_host, connect_host, live, messaging_env
from treemail.adapters import keys
from treemail.domain import events as ev
from treemail.host import SendContext
from treemail.services.peerdelivery import PeerDriver
from treemail.services.sessions import SessionService

from .helpers import WorkerPool, config_for

# A driver that commits the admission, says so, and hangs before it can record the receipt: the test kills it there.
DYING_DRIVER = """
import asyncio, sys
from treemail.adapters.config import load_config
from treemail.adapters.connection import connect
from treemail.adapters.eventstore import EventStore
from treemail.services.clock import SYSTEM_CLOCK
from treemail.services.peerdelivery import PeerDriver
from treemail.services.sessions import SessionService

class Hangs(PeerDriver):
    async def admit_commit(self, *args, **kwargs):
        answer = await super().admit_commit(*args, **kwargs)
        print("ADMITTED", flush=True)
        await asyncio.sleep(3600)
        return answer

async def main():
    config = load_config()
    redis = await connect(config.service.redis_url, config.service)
    store = EventStore(redis, config.service)
    await store.load_scripts()
    await Hangs(store, SessionService(store, config), None, SYSTEM_CLOCK).step()

asyncio.run(main())
"""


class Later:
    def __init__(self, ahead: float) -> None:
        self.ahead = ahead

    def now(self) -> float:
        return time.time() + self.ahead

    def monotonic(self) -> float:
        return time.monotonic() + self.ahead


async def pair(host):
    planner = await host.register_root("planner", "plans", rules={"child": "allow"})
    partitions = adapters(host).config.service.partitions
    while True:
        advisor = await host.register_root("advisor", "advises", rules={}, status="idle")
        if keys.partition_of(advisor.root_session_id, partitions) != keys.partition_of(planner.root_session_id,
                                                                                       partitions):
            break
    await host.peers.register_route("advisor", advisor.session_id, source_session_id=planner.session_id)
    await host.peers.set_grant(advisor.session_id, source_session_id=planner.session_id, send=True, read=True)
    await live(host, planner)
    return planner, advisor


@pytest.mark.slow
@pytest.mark.expected_duration_s(20)
async def test_a_driver_killed_mid_admission_leaves_exactly_one_admission(redis_url):
    config = config_for(redis_url, peer_admit_inline=False)
    host = await connect_host(config, redis_url)
    try:
        planner, advisor = await pair(host)
        sent = await host.peers.send(SendContext(planner.session_id, "run-1", "call-1"),
                                     {"peer": "advisor", "body": "once only"})
        env = {**os.environ, "REDIS_URL": redis_url, **WORKER_ENV, **backend_env(),
               **messaging_env(peer_admit_inline=False)}
        dying = subprocess.Popen([sys.executable, "-c", DYING_DRIVER], env=env, stdout=subprocess.PIPE,
                                 start_new_session=True)
        try:
            line = await asyncio.wait_for(asyncio.to_thread(dying.stdout.readline), 60)
            assert line.strip() == b"ADMITTED"
        finally:
            os.kill(dying.pid, signal.SIGKILL)
            dying.wait()
        in_flight = await host.obligations.inspect(sent["message_id"])
        assert (in_flight["status"], in_flight["attempts"]) == ("pending", 1)  # the receipt was never recorded

        server = adapters(host)
        # Another driver, once the attempt timeout (30 s) has passed on its clock.
        survivor = PeerDriver(server.store, SessionService(server.store, config, Later(31)), None, Later(31))
        await survivor.drive(await server.sessions.record(planner.session_id))  # attempt 1 timed out
        later = PeerDriver(server.store, SessionService(server.store, config, Later(33)), None, Later(33))
        await later.drive(await server.sessions.record(planner.session_id))  # attempt 2, same identity
        status = await host.obligations.inspect(sent["message_id"], planner.session_id)
        assert status["status"] == "accepted", status
        history = await host.history(advisor.session_id)
        assert [e.message_id for _, e in history if isinstance(e, ev.ProducerMessageAccepted)] == [sent["message_id"]]
        attempts = [e.attempt for _, e in await host.history(planner.session_id)
                    if isinstance(e, ev.PeerAttemptStarted)]
        assert attempts == [1, 2]
    finally:
        await close_host(host)


@pytest.mark.slow
@pytest.mark.expected_duration_s(25)
async def test_the_shared_capacity_is_exact_with_several_senders_while_a_worker_is_killed(redis_url):
    capacity = 12
    messaging = {"max_outstanding_per_source": capacity, "max_pending_per_session": 1000,
                 "max_inflight_per_pair": 0, "peer_admit_inline": False}
    config = config_for(redis_url, **messaging)
    async with WorkerPool(redis_url, extra_env=backend_env(), **messaging) as pool:
        await pool.start(2)
        hosts = [await connect_host(config, redis_url) for _ in range(3)]
        try:
            planner, advisor = await pair(hosts[0])
            child = await hosts[0].register_child(planner.session_id, "explore", "reads", rules={"parent": "allow"},
                                                  status="idle")

            async def one(i: int) -> dict:
                host = hosts[i % len(hosts)]
                context = SendContext(planner.session_id, "run-1", f"call-{i}")
                if i % 2:
                    return await host.peers.send(context, {"peer": "advisor", "body": f"peer {i}"})
                result = await host.send_message(context, {"to": child.handle, "body": f"tree {i}"})
                while result.get("error", {}).get("code") == "send_message:engine_shutdown":
                    result = await host.send_message(context, {"to": child.handle, "body": f"tree {i}"})
                return result

            tasks = [asyncio.create_task(one(i)) for i in range(40)]
            await asyncio.sleep(0.05)
            os.kill(pool.live()[0].pid, signal.SIGKILL)
            results = await asyncio.gather(*tasks)
            accepted = [r for r in results if "error" not in r]
            refused = {r["error"]["code"] for r in results if "error" in r}
            assert len(accepted) == capacity and refused == {"send_message:source_capacity"}, results
            server = adapters(hosts[0])
            state = (await server.store.load(await server.sessions.record(planner.session_id))).state
            records = [e for _, e in await hosts[0].history(planner.session_id)
                       if isinstance(e, ev.MessageSent | ev.PeerIntentStored)]
            assert state.outstanding == len(records) == capacity
        finally:
            for host in hosts:
                await close_host(host)
