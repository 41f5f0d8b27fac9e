"""On one server with the fast profile, an append that applies also answers its command and acknowledges
its entry (one round trip less per batch); anything else is answered as before."""

import asyncio
import json

import pytest

from treemail.adapters import keys
from treemail.adapters.codec import encode_command
from treemail.adapters.config import ServiceConfig
from treemail.adapters.connection import connect
from treemail.adapters.eventstore import EventStore, Reply
from treemail.consumers.app import Worker
from treemail.domain import events as ev
from treemail.domain.commands import SendArguments, SendContext, SendMessage
from treemail.domain.records import SessionRecord

from treemail.services.sends import ANSWERED_BY_APPENDS_UP_TO

from ..conftest import CLUSTER
from .conftest import adapters, close_host, connect_host, make_config
from .test_event_store_contract import prepare

pytestmark = pytest.mark.skipif(CLUSTER, reason="a cluster answers after the appends (different slots)")


def test_only_one_server_under_the_fast_profile_answers_in_the_append():
    assert EventStore(None, ServiceConfig()).answers_in_commit
    assert not EventStore(None, ServiceConfig(profile="durable")).answers_in_commit
    assert not EventStore(None, ServiceConfig(cluster=True)).answers_in_commit


async def test_an_append_answers_and_acknowledges_only_if_it_applies(redis_url):
    config = make_config(redis_url).service
    store = EventStore(await connect(redis_url, config), config)
    await store.load_scripts()
    r = SessionRecord(session_id="s-1", root_session_id="root-1", parent_session_id=None, agent_type="explore",
                      description="", handle=None, rules=[("*", "allow")], send_message_tool=True, partition=3)
    registered = ev.SessionRegistered(session_id="s-1", root_session_id="root-1", parent_session_id=None,
                                      agent_type="explore", description="", handle=None, rules=[],
                                      send_message_tool=True, status="idle")
    stream, reply_list = keys.command_stream(0), keys.reply_list("client-1")
    await store.ensure_command_group(1)
    entry_id = await store.redis.xadd(stream, {"__data__": "{}"})
    await store.redis.xreadgroup(keys.COMMAND_GROUP, "w", {stream: ">"})
    stale = await store.load(r)
    assert (await store.append(prepare(store, r, stale, [registered]))).status == "ok"
    reply = Reply(reply_list, '{"command_id":"c-1"}', stream, entry_id)

    conflict = await store.append(prepare(store, r, stale, [ev.SessionStatusChanged(status="running")], reply=reply))
    assert conflict.status == "conflict"
    assert await store.redis.llen(reply_list) == 0
    assert (await store.redis.xpending(stream, keys.COMMAND_GROUP))["pending"] == 1

    applied = await store.append(prepare(store, r, await store.load(r), [ev.SessionStatusChanged(status="running")],
                                               reply=reply))
    assert applied.status == "ok"
    assert await store.redis.lrange(reply_list, 0, -1) == [b'{"command_id":"c-1"}']
    assert 0 < await store.redis.ttl(reply_list) <= keys.REPLY_TTL_S
    assert (await store.redis.xpending(stream, keys.COMMAND_GROUP))["pending"] == 0
    await store.redis.aclose()


async def watched_worker(redis_url, **messaging) -> tuple[Worker, list]:
    """A started worker whose separate answer step is watched: the commands it answered apart."""
    worker = Worker(make_config(redis_url, **messaging), redis_url, consumer="watched")
    answered_apart: list = []
    original = worker.batches.answer

    async def watched(rest, outcomes, stream):
        answered_apart.extend(command.command_id for command, _ in rest)
        await original(rest, outcomes, stream)

    # Watched before it starts: the commands are already waiting, and a worker may decide and answer
    # them before ``start`` returns.
    worker.batches.answer = watched
    await worker.start()
    return worker, answered_apart


async def sender_and_recipient(host) -> tuple:
    root = await host.register_root("planner", "plans", rules={"child": "allow"})
    child = await host.register_child(root.session_id, "explore", "reads", rules={"parent": "allow"})
    await host.start_run(root.session_id, "run-1")
    return root, child


async def waiting(host, commands: list[SendMessage]) -> str:
    """The commands XADDed before any worker reads, so that one batch takes them together; their stream."""
    stream = keys.command_stream(0)
    async with adapters(host).redis.pipeline(transaction=False) as pipe:
        for command in commands:
            pipe.xadd(stream, {"__data__": encode_command(command)})
        await pipe.execute()
    return stream


async def test_an_accepted_send_needs_no_answer_step_and_a_refusal_kept_alone_still_gets_one(redis_url, calls):
    host = await connect_host(make_config(redis_url), redis_url)
    worker, answered_apart = await watched_worker(redis_url)
    try:
        root, child = await sender_and_recipient(host)

        sent = await asyncio.gather(*[host.send_message(calls.ctx(root.session_id), {"to": child.handle, "body": b})
                                      for b in ("one", "two", "three")])
        assert all("message_id" in s for s in sent) and answered_apart == []

        refused = await host.send_message(calls.ctx(root.session_id), {"to": "nobody_00000000", "body": "x"})
        assert refused["error"]["code"] == "send_message:unknown_session"
        assert len(answered_apart) == 1
        for index in range(make_config(redis_url).service.command_streams):
            assert (await adapters(host).redis.xpending(keys.command_stream(index), keys.COMMAND_GROUP))["pending"] == 0
    finally:
        await close_host(host)
        await worker.stop()


async def test_a_command_delivered_twice_in_one_batch_is_answered_twice_and_both_entries_acknowledged(redis_url):
    host = await connect_host(make_config(redis_url), redis_url)
    worker = None
    try:
        root, child = await sender_and_recipient(host)
        command = SendMessage("cmd-twice", SendContext(root.session_id, "run-1", "call-twice"),
                              SendArguments(to=child.handle, body="once"), "twice-client")
        stream = await waiting(host, [command, command])
        worker, answered_apart = await watched_worker(redis_url)

        first = await adapters(host).redis.blpop([keys.reply_list("twice-client")], timeout=10)
        second = await adapters(host).redis.blpop([keys.reply_list("twice-client")], timeout=10)

        assert json.loads(first[1]) == json.loads(second[1])  # the second from the first one's record
        assert answered_apart == ["cmd-twice"]  # the first by its append, the second apart
        assert (await adapters(host).redis.xpending(stream, keys.COMMAND_GROUP))["pending"] == 0
        accepted = [e for _, e in await host.history(child.session_id) if isinstance(e, ev.ProducerMessageAccepted)]
        assert len(accepted) == 1
    finally:
        await close_host(host)
        if worker is not None:
            await worker.stop()


async def test_a_batch_larger_than_the_limit_is_answered_in_one_step_after_its_appends(redis_url):
    host = await connect_host(make_config(redis_url), redis_url)
    worker = None
    try:
        root, child = await sender_and_recipient(host)
        count = ANSWERED_BY_APPENDS_UP_TO + 4
        stream = await waiting(host, [
            SendMessage(f"cmd-{i}", SendContext(root.session_id, "run-1", f"call-{i}"),
                        SendArguments(to=child.handle, body=f"m{i}"), "batch-client")
            for i in range(count)
        ])
        worker, answered_apart = await watched_worker(redis_url, max_inflight_per_pair=0)

        answers = [await adapters(host).redis.blpop([keys.reply_list("batch-client")], timeout=10) for _ in range(count)]

        assert all("ok" in json.loads(a[1]) for a in answers)
        assert sorted(answered_apart) == sorted(f"cmd-{i}" for i in range(count))
        assert (await adapters(host).redis.xpending(stream, keys.COMMAND_GROUP))["pending"] == 0
    finally:
        await close_host(host)
        if worker is not None:
            await worker.stop()
