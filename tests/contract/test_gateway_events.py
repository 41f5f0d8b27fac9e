"""Wakes and interrupts as server-sent events, on a real stack: a reconnect after the last event id received
resumes exactly after it, heartbeats keep an idle stream talking, the streams open at once are bounded; and
the gateway's /healthz and /readyz answer as a worker's do."""

import asyncio
import urllib.request

import redis.asyncio as aioredis

from treemail.adapters import keys
from treemail.adapters.config import Config, ServiceConfig
from treemail.adapters.embedded import LocalValkey
from treemail.entrypoints import gatewaywire
from treemail.host import SendContext

from .sse import EventStream
from .stack import gateway_stack
from .test_gateway import _own_database

FOLLOW = "/v1/wakes/stream?consumer=follower&heartbeat_ms=200"


def quiet_config(url: str) -> Config:
    # Triggers read and left unacknowledged are not reclaimed during the test: what a stream sends again is
    # only what its client never received.
    return Config(service=ServiceConfig(redis_url=url, command_streams=1, partitions=4, reclaim_idle_ms=60_000))


async def idle_children_with_mail(tm, count: int, tag: str) -> list[str]:
    """``count`` idle children, each sent one message: one wake trigger each."""
    root = await tm.register_root("planner", rules={"child": "allow"})
    await tm.start_run(root.session_id, "run-1")
    children = []
    for i in range(count):
        child = await tm.register_child(root.session_id, "explore", rules={"parent": "allow"}, status="idle")
        answer = await tm.send_message(SendContext(root.session_id, "run-1", f"{tag}-{i}"),
                                       {"to": child.handle, "body": "wake up"})
        assert answer["recipient_state"] == "queued", answer
        children.append(child.session_id)
    return children


async def events(stream: EventStream, n: int) -> list:
    return [await stream.event() for _ in range(n)]


async def test_a_reconnect_with_the_last_event_id_resumes_exactly_after_the_last_wake_seen(valkey):
    url = await _own_database(valkey, 9)
    async with gateway_stack(url, quiet_config(url)) as (tm, base_url):
        woken = await idle_children_with_mail(tm, 3, "first")
        stream = await EventStream.open(base_url, FOLLOW)
        assert stream.status == 200 and stream.headers["content-type"].startswith("text/event-stream")
        # The gateway read all three for this runner; the client takes the first and goes away.
        (seen,) = await events(stream, 1)
        await stream.close()
        assert seen.event == "wake" and seen.json()["session_id"] in woken

        stream = await EventStream.open(base_url, FOLLOW, last_event_id=seen.id)
        rest = await events(stream, 2)
        assert sorted(e.json()["session_id"] for e in rest) == sorted(set(woken) - {seen.json()["session_id"]})
        # Nothing else is owed: the next thing said is a heartbeat, then a new wake as it comes.
        assert (await stream.block()).comments == ["heartbeat"]
        (late,) = await idle_children_with_mail(tm, 1, "late")
        (live,) = await events(stream, 1)
        assert live.json()["session_id"] == late
        await stream.close()

        # With the last id received, none again; without one (a runner starting afresh under its name) every
        # trigger it read and never acknowledged, and none once they are acknowledged.
        stream = await EventStream.open(base_url, FOLLOW, last_event_id=live.id)
        assert (await stream.block()).comments == ["following wakes"]
        assert (await stream.block()).comments == ["heartbeat"]
        await stream.close()
        stream = await EventStream.open(base_url, FOLLOW)
        again = await events(stream, 4)
        await stream.close()
        assert sorted(e.json()["session_id"] for e in again) == sorted([*woken, late])
        for i, event in enumerate(again):
            assert await tm.wake_run(tm_wake(event.json()), f"run-{i}")
        stream = await EventStream.open(base_url, FOLLOW)
        await stream.block()  # the opening comment
        assert (await stream.block()).comments == ["heartbeat"]
        await stream.close()


def tm_wake(data: dict):
    from treemail.host import Wake

    return Wake(**data)


async def test_an_interrupt_comes_as_an_event_to_the_runner_of_the_open_run(valkey):
    url = await _own_database(valkey, 10)
    async with gateway_stack(url, quiet_config(url)) as (tm, base_url):
        boss = await tm.register_root("planner", rules={"message": {"child": "allow"}, "interrupt": {"child": "allow"}})
        worker = await tm.register_child(boss.session_id, "explore", rules={"parent": "allow"})
        await tm.start_run(boss.session_id, "boss-run")
        await tm.start_run(worker.session_id, "worker-run")
        asked = await tm.tools.call(SendContext(boss.session_id, "boss-run", "toolu_01"), "interrupt_agent",
                                    {"to": worker.handle, "reason": "stop"})
        assert asked["result"] == "interrupt_requested", asked
        stream = await EventStream.open(base_url, "/v1/interrupts/stream?consumer=aborter&heartbeat_ms=200")
        (event,) = await events(stream, 1)
        await stream.close()
        assert event.event == "interrupt"
        assert (event.json()["session_id"], event.json()["run_id"]) == (worker.session_id, "worker-run")


async def test_streams_past_the_bound_are_refused_and_a_bad_last_event_id_is_invalid(valkey, monkeypatch):
    monkeypatch.setattr(gatewaywire, "MAX_WAITING_READS", 1)
    url = await _own_database(valkey, 11)
    async with gateway_stack(url, quiet_config(url)) as (_, base_url):
        refused = await EventStream.open(base_url, FOLLOW, last_event_id="not-a-position")
        assert (refused.status, (await refused.refusal())["error"]["code"]) == (400, "gateway:invalid_request")
        refused = await EventStream.open(base_url, FOLLOW, last_event_id="9:1-0")  # partition 9 of 4
        assert refused.status == 400
        await refused.close()

        first = await EventStream.open(base_url, FOLLOW)
        assert first.status == 200
        second = await EventStream.open(base_url, FOLLOW)
        body = await second.refusal()
        assert (second.status, body["error"]["code"]) == (429, "gateway:too_many_streams")
        assert body["error"]["retry_after_ms"] > 0 and second.headers["retry-after"] == "1"
        await first.close()
        # The stream that went away gave its room back at once (not at its next heartbeat).
        for _ in range(100):
            again = await EventStream.open(base_url, FOLLOW)
            if again.status == 200:
                break
            await again.refusal()
            await asyncio.sleep(0.05)
        assert again.status == 200
        await again.close()


def _probe(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=5) as answer:
            return answer.status, answer.read().decode().strip()
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode().strip()


async def _until(base_url: str, path: str, status: int) -> tuple[int, str]:
    for _ in range(300):
        answer = await asyncio.to_thread(_probe, base_url + path)
        if answer[0] == status:
            return answer
        await asyncio.sleep(0.1)
    return answer


async def test_readyz_follows_the_server_and_the_runners_group_as_a_workers_does():
    server = LocalValkey().start()
    try:
        async with gateway_stack(server.url, quiet_config(server.url)) as (_, base_url):
            assert await _until(base_url, "/readyz", 200) == (200, "ready")
            assert (await asyncio.to_thread(_probe, base_url + "/healthz")) == (200, "alive")
            # A server back without its data: the probe recreates the runners' group on every wake stream.
            client = aioredis.Redis.from_url(server.url)
            await client.xgroup_destroy(keys.wake_stream(0), keys.WAKE_GROUP)
            for _ in range(100):
                groups = [g["name"] for g in await client.xinfo_groups(keys.wake_stream(0))]
                if keys.WAKE_GROUP.encode() in groups or keys.WAKE_GROUP in groups:
                    break
                await asyncio.sleep(0.1)
            await client.aclose()
            assert keys.WAKE_GROUP.encode() in groups or keys.WAKE_GROUP in groups
            server.stop()
            status, why = await _until(base_url, "/readyz", 503)
            assert status == 503 and why, why
            assert (await asyncio.to_thread(_probe, base_url + "/healthz"))[0] == 200  # alive, not ready
            server.start()
            assert await _until(base_url, "/readyz", 200) == (200, "ready")
    finally:
        server.cleanup()
