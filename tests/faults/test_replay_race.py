"""Scale-out and faults: `treemail replay` while sessions are being registered.

A session registered while the rebuild runs must end up in the views: either
the rebuild folds it, or its events lie after the rebuild's checkpoint and the
live runner folds them. None may fall between the two.
"""

import asyncio
import itertools

import pytest
import redis.asyncio as aioredis

from treemail.adapters.eventstore import EventStore
from treemail.adapters.viewstore import load_view

from treemail.projections.replay import rebuild
from treemail.projections.runner import ProjectionRunner
from treemail.projections.views import PROJECTIONS

from .helpers import config_for
from tests.integration.conftest import adapters, close_host, connect_host


async def stored_views(redis, partitions: int) -> dict:
    return {(name, p): dict((await load_view(redis, p, name))[0]) for p in range(partitions) for name in PROJECTIONS}


@pytest.mark.slow
@pytest.mark.expected_duration_s(20)
async def test_replay_racing_registrations_drops_no_session(redis_url):
    config = config_for(redis_url)
    partitions = config.service.partitions
    host = await connect_host(config, redis_url)
    replayer = aioredis.Redis.from_url(redis_url)
    try:
        # Enough history that the rebuild takes a while: 40 trees of 6, each session with injected mail.
        for _ in range(40):
            root = await host.register_root("planner", "x", rules={"child": "allow"}, status="idle")
            sessions = [root.session_id]
            for _ in range(5):
                sessions.append((await host.register_child(root.session_id, "explore", "x")).session_id)
            for session in sessions:
                for n in range(5):
                    await host.inject(session, "plugin", f"note {n}")
        registering = asyncio.Event()
        registering.set()
        during: list[str] = []

        async def register_while_replaying() -> None:
            for n in itertools.count():
                if not registering.is_set():
                    return
                root = await host.register_root("planner", f"late {n}", rules={"child": "allow"}, status="idle")
                child = await host.register_child(root.session_id, "explore", "late child")
                await host.inject(child.session_id, "plugin", "late mail")
                during.extend([root.session_id, child.session_id])

        registrations = asyncio.create_task(register_while_replaying())
        await asyncio.sleep(0.05)
        await rebuild(EventStore(replayer, config.service), list(range(partitions)))
        registering.clear()
        await registrations
        assert len(during) >= 20, "too few registrations raced the replay to prove anything"

        # The live runner starts from what the replay wrote and catches up.
        runner = ProjectionRunner(EventStore(adapters(host).redis, config.service), config)
        await runner.start()
        while await runner.step(block_ms=None):
            pass
        live = await stored_views(adapters(host).redis, partitions)
        trees = {field for (name, _), view in live.items() if name == "trees" for field in view}
        missing = [s for s in during if f"root:{s}" not in trees]
        assert missing == [], f"{len(missing)} of {len(during)} sessions registered during the replay are missing"
        replayed = await rebuild(EventStore(replayer, config.service), list(range(partitions)), write=False)
        assert live == {key: dict(view) for key, view in replayed.items()}
        print(f"\n{len(during)} sessions registered while the replay ran; all are in the views")
    finally:
        await replayer.aclose()
        await close_host(host)
