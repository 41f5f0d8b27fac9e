"""Projection workers against a real Valkey: live views equal a rebuild from the streams."""

import asyncio
import os
import re
import signal
import subprocess
import sys

import pytest

from treemail.adapters import keys
from treemail.adapters.eventstore import EventStore
from treemail.projections.replay import rebuild
from treemail.projections.runner import ProjectionRunner
from treemail.adapters.viewstore import feed_position, load_view, queue_replace
from treemail.projections.views import PROJECTIONS
from treemail.projections.tail import tail

from ..conftest import backend_env
from .conftest import Calls, adapters, close_host, connect_host, make_config, running_stack

pytestmark = pytest.mark.cluster


async def traffic(host, calls, senders=4, sends=6):
    """A little of everything: sends, consumes, discards, injected mail, wakes, runs."""
    root = await host.register_root("planner", "x", rules={"*": "allow"}, status="running")
    kids = [await host.register_child(root.session_id, "explore", "x", rules={"*": "allow"}, status="running")
            for _ in range(senders)]
    await host.set_status(kids[0].session_id, "idle")
    # Only a session's open run may send (exact live sender): the idle one only receives.
    for kid in (root, *kids[1:]):
        await host.start_run(kid.session_id, "run-1")
    for i in range(sends):
        for kid in kids[1:]:
            await host.send_message(calls.ctx(kid.session_id), {"to": root.handle, "body": f"{i}"})
        await host.send_message(calls.ctx(root.session_id), {"to": kids[i % senders].handle, "body": "x"})
    await host.inject(kids[1].session_id, "plugin", "build done")
    await host.finish_run(root.session_id, "run-1")
    await host.start_run(root.session_id, "run-root")
    for n, delivery in enumerate(await host.claim(root.session_id, "run-root")):
        if n % 3 == 0:
            await host.consume(root.session_id, delivery.message_id)
        elif n % 3 == 1:
            await host.discard(root.session_id, delivery.message_id, "stale")
    return root, kids


async def live_views(redis, config):
    out = {}
    for p in range(config.service.partitions):
        for name in PROJECTIONS:
            view, _ = await load_view(redis, p, name)
            out[(name, p)] = dict(view)
    return out


def as_dicts(views):
    return {key: dict(view) for key, view in views.items()}


async def catch_up(runner):
    while await runner.step(block_ms=50):
        pass


async def test_live_projection_equals_full_rebuild(redis_url):
    calls = Calls()
    async with running_stack(redis_url, max_pending_per_session=1000, max_inflight_per_pair=0) as host:
        config = adapters(host).config
        runner = ProjectionRunner(EventStore(adapters(host).redis, config.service), config)
        await runner.start()
        root, kids = await traffic(host, calls)
        await catch_up(runner)
        live = await live_views(adapters(host).redis, config)
        rebuilt = as_dicts(await rebuild(adapters(host).store, list(range(config.service.partitions)), write=False))
        assert live == rebuilt
        inbox = sum(int(v) for (name, _), view in live.items() if name == "inbox" for f, v in view.items()
                    if not f.startswith("seq:"))
        assert inbox > 0  # the comparison is not between two empty views
        # A checkpoint counts feed entries, one per step (however many events it names), as trimming does.
        for (_, p), checkpoint in runner.checkpoints.items():
            assert checkpoint == (await feed_position(adapters(host).redis, p))[0]


async def test_projection_added_later_starts_from_the_beginning(redis_url):
    calls = Calls()
    async with running_stack(redis_url, max_pending_per_session=1000, max_inflight_per_pair=0) as host:
        config = adapters(host).config
        only_inbox = ProjectionRunner(EventStore(adapters(host).redis, config.service), config, names=["inbox"])
        await only_inbox.start()
        await traffic(host, calls)
        await catch_up(only_inbox)
        # "pairs", "wakes", "trees" never ran: a runner with them must fold all history, not start at now.
        everything = ProjectionRunner(EventStore(adapters(host).redis, config.service), config)
        await everything.start()
        await catch_up(everything)
        live = await live_views(adapters(host).redis, config)
        rebuilt = as_dicts(await rebuild(adapters(host).store, list(range(config.service.partitions)), write=False))
        assert live == rebuilt


async def test_runner_whose_checkpoint_was_trimmed_from_the_feed_rebuilds(redis_url):
    calls = Calls()
    base = make_config(redis_url)
    config = base.model_copy(update={"service": base.service.model_copy(update={"feed_maxlen": 1000,
                                                                                   "partitions": 1})})
    from treemail.consumers.app import Worker


    worker = Worker(config.model_copy(update={"messaging": config.messaging.model_copy(
        update={"max_pending_per_session": 10000, "max_inflight_per_pair": 0})}), redis_url, consumer="w")
    await worker.start()
    host = await connect_host(config, redis_url)
    try:
        runner = ProjectionRunner(EventStore(adapters(host).redis, config.service), config)
        await runner.start()
        await traffic(host, calls, senders=2, sends=2)
        await catch_up(runner)
        # The projection worker is down while far more events than the feed keeps are appended.
        busy = await host.register_root("planner", "busy", status="running")
        for i in range(1300):
            await host.inject(busy.session_id, "plugin", f"{i}")
        first = (await adapters(host).redis.xrange("tm:{p0}:feed", count=1))[0][0]
        assert first != b"0-1"  # the feed was trimmed
        restarted = ProjectionRunner(EventStore(adapters(host).redis, config.service), config)
        await restarted.start()
        await catch_up(restarted)
        live = await live_views(adapters(host).redis, config)
        rebuilt = as_dicts(await rebuild(adapters(host).store, [0], write=False))
        assert live == rebuilt
    finally:
        await close_host(host)
        await worker.stop()


async def test_a_running_projection_worker_the_trim_passes_rebuilds_rather_than_skip_entries(redis_url):
    calls = Calls()
    base = make_config(redis_url, max_pending_per_session=1000, max_inflight_per_pair=0)
    config = base.model_copy(update={"service": base.service.model_copy(update={"partitions": 1})})
    async with running_stack(redis_url, config=config) as host:
        runner = ProjectionRunner(EventStore(adapters(host).redis, config.service), config)
        await runner.start()
        await traffic(host, calls, senders=2, sends=2)
        await catch_up(runner)
        # The runner is slow: before its next read more is appended, and the feed trimmed past its checkpoint.
        await traffic(host, calls, senders=2, sends=2)
        await adapters(host).redis.xtrim(keys.feed(0), maxlen=3, approximate=False)
        await catch_up(runner)
        live = await live_views(adapters(host).redis, config)
        rebuilt = as_dicts(await rebuild(adapters(host).store, [0], write=False))
        assert live == rebuilt


@pytest.mark.slow
async def test_projection_worker_killed_mid_stream_resumes_to_equal_a_rebuild(redis_url):
    calls = Calls()
    env = {**os.environ, "REDIS_URL": redis_url, "TREEMAIL_SERVICE_COMMAND_STREAMS": "2", **backend_env()}
    spawn = lambda: subprocess.Popen(  # noqa: E731
        [sys.executable, "-m", "treemail", "projections", "--metrics-port", "-1"], env=env,
        start_new_session=True,
    )
    async with running_stack(redis_url, max_pending_per_session=10000, max_inflight_per_pair=0) as host:
        projection = spawn()
        try:
            load = asyncio.ensure_future(traffic(host, calls, senders=6, sends=60))
            await asyncio.sleep(1.0)
            os.kill(projection.pid, signal.SIGKILL)
            projection.wait()
            await load
            projection = spawn()
            config = adapters(host).config
            rebuilt = as_dicts(await rebuild(adapters(host).store, list(range(config.service.partitions)), write=False))
            for _ in range(200):
                if await live_views(adapters(host).redis, config) == rebuilt:
                    break
                await asyncio.sleep(0.1)
            assert await live_views(adapters(host).redis, config) == rebuilt
        finally:
            projection.terminate()
            projection.wait(timeout=30)


async def test_replay_cli_rebuilds_every_projection(redis_url):
    calls = Calls()
    async with running_stack(redis_url, max_pending_per_session=1000, max_inflight_per_pair=0) as host:
        await traffic(host, calls)
        env = {**os.environ, "REDIS_URL": redis_url, **backend_env()}
        done = subprocess.run([sys.executable, "-m", "treemail", "replay"], env=env, capture_output=True,
                              text=True, timeout=120)
        assert done.returncode == 0, done.stderr
        assert "rebuilt inbox, pairs, trees, wakes over 16 partitions" in done.stdout
        assert "warning" not in done.stderr  # no projection worker runs here
        # Not a terminal: plain progress lines ending at every session, never \r redraws.
        assert "\r" not in done.stderr
        assert re.search(r"^replay: (\d+)/\1 sessions, [\d,]+ events", done.stderr, re.M), done.stderr
        live = await live_views(adapters(host).redis, adapters(host).config)
        rebuilt = as_dicts(await rebuild(adapters(host).store, list(range(adapters(host).config.service.partitions)), write=False))
        assert live == rebuilt
        trees = subprocess.run([sys.executable, "-m", "treemail", "trees"], env=env, capture_output=True,
                               text=True, timeout=60)
        assert trees.returncode == 0 and " 5 " in trees.stdout  # root + 4 children


async def test_replay_warns_while_a_projection_worker_runs_and_not_after_it_stopped(redis_url):
    from treemail.adapters import keys, members
    from treemail.projections.service import PRESENCE_MS, ProjectionService

    async with running_stack(redis_url) as host:
        server = adapters(host)
        service = ProjectionService(server.config, server.redis)
        running = asyncio.create_task(service.run())
        try:
            for _ in range(100):
                if await members.present(server.redis, keys.projection_members(), PRESENCE_MS):
                    break
                await asyncio.sleep(0.05)
            env = {**os.environ, "REDIS_URL": redis_url, **backend_env()}
            done = await asyncio.to_thread(subprocess.run, [sys.executable, "-m", "treemail", "replay"], env=env,
                                           capture_output=True, text=True, timeout=120)
            assert done.returncode == 0, done.stderr
            [warning] = [line for line in done.stderr.splitlines() if "warning" in line]
            assert "1 projection worker(s) running" in warning and service.name in warning, warning
        finally:
            service.stopping.set()
            await running
        # A stopped worker leaves the set at once: no stale warning afterwards.
        assert await members.present(server.redis, keys.projection_members(), PRESENCE_MS) == []


async def test_tail_live_rows_equal_rows_replayed_from_start(redis_url):
    calls = Calls()
    async with running_stack(redis_url, max_pending_per_session=1000, max_inflight_per_pair=0) as host:
        root = await host.register_root("planner", "x", rules={"*": "allow"}, status="running")
        kid = await host.register_child(root.session_id, "explore", "x", rules={"*": "allow"}, status="running")
        record = await adapters(host).sessions.record(root.session_id)
        live_rows: list[str] = []

        async def follow():
            async for row in tail(adapters(host).store, record):
                live_rows.append(row)

        follower = asyncio.ensure_future(follow())
        await asyncio.sleep(0.2)
        await host.start_run(root.session_id, "r")
        await host.start_run(kid.session_id, "run-1")
        for i in range(5):
            await host.send_message(calls.ctx(kid.session_id), {"to": root.handle, "body": f"finding {i}"})
        for delivery in await host.claim(root.session_id, "r"):
            await host.consume(root.session_id, delivery.message_id)
        for _ in range(50):
            if len(live_rows) >= 15:
                break
            await asyncio.sleep(0.05)
        follower.cancel()
        # The client may finish a cancelled blocking read with its own error later: retrieve it then, or it is
        # logged when the task is collected, which can land inside pytest's teardown.
        follower.add_done_callback(lambda task: task.cancelled() or task.exception())
        replayed = []
        async for row in tail(adapters(host).store, record, from_start=True, block_ms=100):
            replayed.append(row)
            if len(replayed) == len(live_rows):
                break
        assert len(live_rows) == 15  # 5 accepted, 5 claimed, 5 consumed
        assert replayed == live_rows
        assert all("ProducerMessage" in row for row in live_rows)


async def test_projection_gauges_aggregate_the_views(redis_url):
    from treemail.adapters import metrics

    calls = Calls()
    async with running_stack(redis_url, max_pending_per_session=2, max_inflight_per_pair=1) as host:
        config = adapters(host).config
        runner = ProjectionRunner(EventStore(adapters(host).redis, config.service), config)
        await runner.start()
        root = await host.register_root("planner", "x", rules={"*": "allow"}, status="running")
        kids = [await host.register_child(root.session_id, "explore", "x", rules={"*": "allow"}) for _ in range(3)]
        idle = await host.register_child(root.session_id, "idle", "x", rules={"*": "allow"}, status="idle")
        for sender in (root, *kids):
            await host.start_run(sender.session_id, "run-1")
        for kid in kids:
            await host.send_message(calls.ctx(kid.session_id), {"to": root.handle, "body": "x"})
        await host.send_message(calls.ctx(root.session_id), {"to": idle.handle, "body": "wake"})
        wakes_before = metrics.WAKES._value.get()
        await catch_up(runner)
        runner.report_views()
        assert metrics.PENDING_INBOX._value.get() == 3  # the inbox cap refused the third child
        assert metrics.FULL_INBOXES._value.get() == 1
        assert metrics.INFLIGHT_PAIRS._value.get() == 3
        assert metrics.FULL_WINDOWS._value.get() == 3
        assert metrics.WAKES_OUTSTANDING._value.get() == 1
        assert metrics.WAKES._value.get() == wakes_before + 1
        lag = metrics.PROJECTION_LAG_EVENTS.labels("inbox", str(runner.partitions[0]))._value.get()
        assert lag == 0


async def test_a_rebuild_reading_ahead_in_small_chunks_equals_the_live_views(redis_url, monkeypatch):
    """Every stream read two entries at a time, the next read in flight while a chunk is folded one event at a
    time: an entry skipped between chunks, or a stream left after its first chunk, would show in the views."""
    from treemail.projections import replay

    calls = Calls()
    async with running_stack(redis_url, max_pending_per_session=1000, max_inflight_per_pair=0) as host:
        config = adapters(host).config
        runner = ProjectionRunner(EventStore(adapters(host).redis, config.service), config)
        await runner.start()
        await traffic(host, calls)
        await catch_up(runner)
        monkeypatch.setattr(replay, "CHUNK", 2)
        monkeypatch.setattr(replay, "SLICE", 1)
        rebuilt = as_dicts(await rebuild(adapters(host).store, list(range(config.service.partitions)), write=False))
        assert rebuilt == await live_views(adapters(host).redis, config)


async def restore(redis, copy) -> None:
    """Puts back the views and checkpoints of ``copy`` (``load_view``'s, by view): the server lost what was
    written to them since."""
    for partition in {p for _, p in copy}:
        async with redis.pipeline(transaction=True) as pipe:  # a partition's keys share one hash slot
            for (name, p), (view, checkpoint) in copy.items():
                if p == partition:
                    queue_replace(pipe, p, name, view, checkpoint)
            await pipe.execute()


async def step_until_caught_up(runner, redis) -> None:
    """Steps until the runner's every checkpoint is where its feed ends. A step that finds the server's copy
    not as it wrote it folds nothing: the next one reads on from that copy."""
    for _ in range(10):
        await runner.step(block_ms=50)
        ends = [(await feed_position(redis, p))[0] for _, p in runner.checkpoints]
        if list(runner.checkpoints.values()) == ends:
            return
    raise AssertionError(f"the runner never caught up: {runner.checkpoints} against the feeds' ends {ends}")


@pytest.mark.parametrize("lost", ["before the next fold", "between the next fold and its write"])
async def test_a_runner_whose_server_lost_its_last_write_of_views_leaves_views_equal_to_a_rebuild(
        redis_url, monkeypatch, lost):
    """A failover to a replica that had every feed entry the runner folded but not the runner's last write of
    views and checkpoints: the server's copy lacks what that write changed. The runner writes only the fields a
    step changes, so a field that write changed and no later step changes must not stay as the replica has it;
    also when the server loses the write while the runner folds its next step (its next write goes to the new
    primary)."""
    from treemail.adapters import feed

    calls = Calls()
    async with running_stack(redis_url, max_pending_per_session=1000, max_inflight_per_pair=0) as host:
        server = adapters(host)
        config = server.config
        runner = ProjectionRunner(EventStore(server.redis, config.service), config)
        await runner.start()
        root, kids = await traffic(host, calls)
        await catch_up(runner)
        partitions = range(config.service.partitions)
        # The replica's copy: the views and checkpoints as the runner wrote them before the fault.
        replica = {(name, p): await load_view(server.redis, p, name) for p in partitions for name in PROJECTIONS}
        # Mail for the root: its feed entry reaches the replica, the runner's write of its fold does not.
        await host.send_message(calls.ctx(kids[1].session_id), {"to": root.handle, "body": "before the fault"})
        await catch_up(runner)
        written = await live_views(server.redis, config)
        resolve = feed.resolve
        failovers = []

        async def failover() -> None:
            await restore(server.redis, replica)
            failovers.append(await live_views(server.redis, config))

        async def resolve_after_a_failover(*args, **kwargs):
            monkeypatch.setattr(feed, "resolve", resolve)
            await failover()
            return await resolve(*args, **kwargs)

        if lost == "before the next fold":
            await failover()
        else:
            monkeypatch.setattr(feed, "resolve", resolve_after_a_failover)
        # After the failover: mail for another session, which leaves the root's inbox and pair fields alone.
        await host.send_message(calls.ctx(root.session_id, "run-root"), {"to": kids[2].handle, "body": "after"})
        await step_until_caught_up(runner, server.redis)
        [without_the_write] = failovers
        assert without_the_write != written  # the failover took the runner's last write
        rebuilt = as_dicts(await rebuild(server.store, list(partitions), write=False))
        assert await live_views(server.redis, config) == rebuilt
