"""Scale-out and faults: the server restarts under a running projection worker (a real `treemail projections`).

The worker must ride out restarts of any length, even 0.08 s, and afterwards
its views must equal a rebuild from the session streams alone.
"""

import asyncio
import os
import random
import subprocess
import sys
import tempfile
import time

import pytest
import redis.asyncio as aioredis

from treemail.adapters.config import ServiceConfig
from treemail.adapters.embedded import LocalValkey
from treemail.adapters.eventstore import EventStore
from treemail.host import SendContext, Treemail

from .helpers import WorkerPool, build_tree, caught_up, config_for, load_until, views_against_a_rebuild

MESSAGING = {"max_pending_per_session": 100000, "max_inflight_per_pair": 0}


@pytest.mark.slow
@pytest.mark.expected_duration_s(12)
async def test_projection_worker_survives_server_restarts_and_its_views_equal_a_replay():
    server = LocalValkey(durable=True).start()
    log = tempfile.NamedTemporaryFile(prefix="treemail-projections-", suffix=".log", delete=False)
    projections = None
    try:
        config = config_for(server.url, decision_timeout_s=3, **MESSAGING)
        partitions = config.service.partitions
        env = {**os.environ, "REDIS_URL": server.url, "TREEMAIL_SERVICE_COMMAND_STREAMS": "2",
               "TREEMAIL_PROJECTION_METRICS_PORT": "-1", "TREEMAIL_LOG": "WARNING"}
        async with WorkerPool(server.url, **MESSAGING) as pool:
            await pool.start(1)
            host = await Treemail.connect(config, server.url)
            try:
                tree = await build_tree(host, [6], status="idle")
                for session in tree.sessions:  # only a session's open run may send (exact live sender)
                    await host.start_run(session, "run-1")
                projections = subprocess.Popen([sys.executable, "-m", "treemail", "projections"], env=env,
                                               stdout=log, stderr=log, start_new_session=True)
                loading = asyncio.Event()
                loading.set()
                sent = 0

                async def sender(n: int) -> None:
                    nonlocal sent
                    rng = random.Random(n)
                    count = 0
                    while loading.is_set():
                        me = rng.choice(tree.sessions)
                        ctx = SendContext(me, "run-1", f"s{n}-{count}")
                        count += 1
                        result = await host.send_message(ctx, {"to": tree.handles[rng.choice(tree.neighbours[me])],
                                                               "body": f"#{count}"})
                        if "message_id" in result:
                            sent += 1
                        else:
                            await asyncio.sleep(0.05)  # engine_shutdown during an outage: carry on

                async def restarts() -> list[float]:
                    outages = []
                    for pause, kill in ((0.08, True), (0.08, False), (0.5, True)):
                        await asyncio.sleep(1.5)
                        started = time.monotonic()
                        await asyncio.to_thread(server.stop, kill)
                        await asyncio.sleep(pause)
                        await asyncio.to_thread(server.start)
                        outages.append(time.monotonic() - started)
                        assert projections.poll() is None, open(log.name).read()
                    await load_until(lambda: sent > 50, 1.5, what="the sends through the restarts")
                    loading.clear()
                    return outages

                outages, *_ = await asyncio.gather(restarts(), *(sender(n) for n in range(3)))
                assert sent > 50
                check = aioredis.Redis.from_url(server.url)
                try:
                    deadline = time.monotonic() + 120
                    while not await caught_up(check, partitions):
                        assert time.monotonic() < deadline, "the projection worker never caught up"
                        assert projections.poll() is None, open(log.name).read()
                        await asyncio.sleep(0.2)
                    assert projections.poll() is None, open(log.name).read()
                    store = EventStore(check, ServiceConfig(partitions=partitions))
                    equal, _ = await views_against_a_rebuild(store, partitions)
                    assert equal, "the projection worker's views differ from a rebuild from the streams"
                finally:
                    await check.aclose()
            finally:
                await host.close()
        print(f"\n{sent} sends over {len(outages)} server restarts "
              f"({', '.join(f'{o:.2f} s' for o in outages)}); the projection worker stayed up and its views "
              "equal a replay")
    finally:
        if projections is not None and projections.poll() is None:
            projections.terminate()
            projections.wait(30)
        os.unlink(log.name)
        server.cleanup()
