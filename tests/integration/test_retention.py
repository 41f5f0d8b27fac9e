"""Nothing transient grows without bound, and per-message operations cost the same however long the backlog."""

import asyncio
import dataclasses
import time

import pytest
import redis.asyncio as aioredis

from treemail.adapters import keys
from treemail.adapters.retention import trim_handled
from treemail.consumers import deadletters
from treemail.consumers.app import Worker
from treemail.domain import commands as c
from treemail.domain.handlers import HANDLERS

from ..conftest import CLUSTER
from .conftest import adapters, live, make_config

pytestmark = pytest.mark.cluster


def raw_client(url: str):
    if CLUSTER:
        from redis.asyncio.cluster import RedisCluster

        return RedisCluster.from_url(url)
    return aioredis.Redis.from_url(url)


async def eventually(predicate, timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if await predicate():
            return True
        await asyncio.sleep(0.05)
    return False


async def test_command_streams_keep_only_commands_not_yet_handled(stack, calls):
    root = await stack.register_root("planner", "x", rules={"child": "allow"})
    child = await stack.register_child(root.session_id, "explore", "x")
    await live(stack, root)  # only a session's open run may send (exact live sender)
    for _ in range(40):  # decided (most refused by the pair window: a command all the same)
        result = await stack.send_message(calls.ctx(root.session_id), {"to": child.handle, "body": "x"})
        assert "engine_shutdown" not in str(result)
    streams = [keys.command_stream(i) for i in range(adapters(stack).config.service.command_streams)]

    async def trimmed() -> bool:
        return sum([await adapters(stack).redis.xlen(s) for s in streams]) <= len(streams)

    # The worker's periodic task (every reclaim_idle_ms / 2) trims; at most each stream's last entry stays.
    assert await eventually(trimmed)


async def test_trimming_keeps_every_pending_and_every_unread_entry(redis_url):
    raw = raw_client(redis_url)
    stream = keys.command_stream(0)
    try:
        await raw.xgroup_create(stream, "readers", id="0", mkstream=True)
        ids = [await raw.xadd(stream, {"n": n}) for n in range(10)]
        await raw.xreadgroup("readers", "r1", {stream: ">"}, count=6)  # read 0..5
        await raw.xack(stream, "readers", *ids[:2], *ids[3:6])  # 2 stays pending
        assert await trim_handled(raw, stream) == 2  # only 0 and 1 go
        left = [entry_id for entry_id, _ in await raw.xrange(stream)]
        assert left == ids[2:]
        await raw.xack(stream, "readers", ids[2])
        await trim_handled(raw, stream)
        # Everything read was acknowledged: the last read entry is kept, nothing unread is dropped.
        assert [entry_id for entry_id, _ in await raw.xrange(stream)] == ids[5:]
        assert await trim_handled(raw, "tm:no-such-stream") == 0
    finally:
        await raw.aclose()


async def test_trimming_keeps_what_any_group_of_the_stream_still_owes(redis_url):
    raw = raw_client(redis_url)
    stream = keys.wake_stream(0)
    try:
        for group in ("ahead", "behind"):
            await raw.xgroup_create(stream, group, id="0", mkstream=True)
        ids = [await raw.xadd(stream, {"n": n}) for n in range(10)]
        await raw.xreadgroup("ahead", "r1", {stream: ">"}, count=10)
        await raw.xack(stream, "ahead", *ids)
        await raw.xreadgroup("behind", "r2", {stream: ">"}, count=4)  # read 0..3
        await raw.xack(stream, "behind", *ids[:4])
        assert await trim_handled(raw, stream) == 3  # 0..2 go: the group behind has not read past 3
        assert [entry_id for entry_id, _ in await raw.xrange(stream)] == ids[3:]
    finally:
        await raw.delete(stream)
        await raw.aclose()


async def test_wake_streams_drop_handled_wakes(stack, calls):
    root = await stack.register_root("planner", "x", rules={"child": "allow"})
    child = await stack.register_child(root.session_id, "explore", "x", status="idle")
    await live(stack, root)
    partition = (await adapters(stack).sessions.record(child.session_id)).partition
    for n in range(5):
        await stack.send_message(calls.ctx(root.session_id), {"to": child.handle, "body": "wake up"})
        [wake] = await stack.wakes("runner-1", block_ms=2000)
        await stack.wake_run(wake, f"run-{n}")
        for delivery in await stack.claim(child.session_id, f"run-{n}"):
            await stack.consume(child.session_id, delivery.message_id)
        await stack.finish_run(child.session_id, f"run-{n}")

    async def trimmed() -> bool:
        return await adapters(stack).redis.xlen(keys.wake_stream(partition)) <= 1

    assert await eventually(trimmed)


async def test_an_interrupt_the_wake_runners_passed_over_is_kept_until_an_interrupt_reader_handles_it(stack, calls):
    """Interrupts ride the wake streams: the trim keeps each until the interrupt readers handled it, even when
    the wake runners acknowledged it long before the first interrupt reader joined."""
    rules = {"message": {"child": "allow"}, "interrupt": {"child": "allow"}}
    root = await stack.register_root("planner", "x", rules=rules)
    busy = await stack.register_child(root.session_id, "explore", "x", status="running")
    idle = await stack.register_child(root.session_id, "explore", "y", status="idle")
    await live(stack, root)
    await stack.start_run(busy.session_id, "long-run")
    stream = keys.wake_stream((await adapters(stack).sessions.record(busy.session_id)).partition)
    assert stream == keys.wake_stream((await adapters(stack).sessions.record(idle.session_id)).partition)
    asked = await stack.interrupts.interrupt_agent(calls.ctx(root.session_id), {"to": busy.handle, "reason": "stop"})
    assert asked["result"] == "interrupt_requested"
    # A wake after it: the wake runner reads both, acknowledges the interrupt as not its kind, starts the run.
    await stack.send_message(calls.ctx(root.session_id), {"to": idle.handle, "body": "wake up"})
    [wake] = await stack.wakes("runner-1", block_ms=2000)
    assert wake.session_id == idle.session_id and await stack.wake_run(wake, "run-1")
    redis = adapters(stack).redis
    await trim_handled(redis, stream)
    [interrupt] = await stack.interrupts.read("runner-1", block_ms=2000)
    assert (interrupt.session_id, interrupt.run_id, interrupt.reason) == (busy.session_id, "long-run", "stop")
    # Handled by its reader: now every group has passed it, and the trim drops it.
    assert await stack.interrupts.abort_run(interrupt)
    await trim_handled(redis, stream)
    assert interrupt.entry_id not in [entry_id.decode() for entry_id, _ in await redis.xrange(stream)]


async def test_dead_letters_keep_a_bounded_count_and_payload(redis_url, monkeypatch):
    monkeypatch.setattr(deadletters, "MAXLEN", 10)
    config = make_config(redis_url)
    worker = Worker(config, redis_url, consumer="dead-letter-bounds")
    raw = raw_client(redis_url)
    await worker.start()
    try:
        for _ in range(30):
            await raw.xadd(keys.command_stream(0), {"__data__": b"{" + b"x" * 1_000_000})

        async def all_set_aside() -> bool:
            return (await raw.xpending(keys.command_stream(0), keys.COMMAND_GROUP))["pending"] == 0 and (
                await raw.xinfo_stream(keys.dead_letters()))["entries-added"] == 30

        assert await eventually(all_set_aside)
        letters = await raw.xrange(keys.dead_letters())
        assert len(letters) <= 10 + 100  # MAXLEN ~: within one node of the bound
        for _, fields in letters:
            assert len(fields[b"data"]) == deadletters.DATA_BYTES and fields[b"size"] == b"1000001"
            assert fields[b"reason"] == b"malformed"
    finally:
        await worker.stop()
        await raw.aclose()


async def test_claim_and_consume_read_only_the_mail_they_need(stack, monkeypatch):
    """A backlog of mail the run may not take yet (queued) costs a claim and a consume nothing."""
    root = await stack.register_root("planner", "x", rules={"child": "allow"})
    child = await stack.register_child(root.session_id, "explore", "x", status="running")
    await stack.start_run(child.session_id, "run-1")
    for n in range(1500):
        await stack.inject(child.session_id, "plugin", f"later {n}", mode="queue")
    steer = await stack.inject(child.session_id, "plugin", "now", mode="steer")
    read: dict[str, list[int]] = {}
    for command in (c.ClaimMail, c.ConsumeMail):
        handler = HANDLERS[command]

        def spy(cmd, given, decide=handler.decide, name=command.__name__):
            read.setdefault(name, []).append(len(given.mail))
            return decide(cmd, given)

        monkeypatch.setitem(HANDLERS, command, dataclasses.replace(handler, decide=spy))
    started = time.perf_counter()
    [delivery] = await stack.claim(child.session_id, "run-1")
    await stack.consume(child.session_id, delivery.message_id)
    elapsed = time.perf_counter() - started
    assert delivery.message_id == steer
    assert read == {"ClaimMail": [1], "ConsumeMail": [1]}
    assert len(await stack.obligations.pending_mail(child.session_id)) == 1500
    print(f"\nclaim + consume beside 1,500 pending messages: {elapsed * 1000:.1f} ms")


async def test_a_session_with_a_few_events_holds_a_stream_node_of_2_kb_not_4(stack):
    # The tests' servers are configured as the deploy files and `treemail server` are (stream-node-max-bytes
    # 2048): a stream's first node is allocated at that size, most of a small session's memory.
    root = await stack.register_root("planner", "plans the work", rules={})
    record = await adapters(stack).sessions.record(root.session_id)
    stream = keys.session_stream(record.partition, record.session_id)
    assert await adapters(stack).redis.xlen(stream) >= 1
    assert await adapters(stack).redis.memory_usage(stream) < 2600
