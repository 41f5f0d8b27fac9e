"""One append that fills every section of the commit script's arguments lands each in its place: the
session's events, snapshot, registration, mail changes (new, moved, done), wakes, approvals, tree grants,
due index, feed entry, its own outbound records and idempotency record; two companions' events, snapshots,
outbound records, notice mail, wakes and due entries; the answer, its acknowledgement and the drain flag.

Its expectations are the writes as the script made them before its arguments were opened by a header of
section offsets (``commitargs``): the same writes, section by section."""

import dataclasses

import pytest

from treemail.adapters import keys
from treemail.adapters.compact import encode_item, encode_outbound, encode_record, id_bytes, record_field
from treemail.adapters.eventstore import Reply
from treemail.domain import events as ev
from treemail.domain.commitplan import Idempotency, SourceWrite, plan_commit
from treemail.domain.protocol import PROTOCOL_VERSION
from treemail.domain.state import MailItem

from ..conftest import CLUSTER
from .test_event_store_contract import accepted, record, registered, store  # noqa: F401 (fixture)

pytestmark = pytest.mark.skipif(CLUSTER, reason="an answer in the append needs one server")


def item(message_id: str, seq: int, state: str = "accepted") -> MailItem:
    return MailItem(message_id=message_id, owner="goal", sender_session_id=None, agent_hop=0, mode="queue",
                    state=state, run_id=None, seq=seq)


async def registered_companion(store, session_id: str):
    r = record(session_id, handle=None)
    loaded = await store.load(r)
    result = await store.append(store.prepare(plan_commit(r, loaded.state, 0, [registered(r)]), loaded))
    assert result.status == "ok"
    return r, await store.load(r)


async def test_an_append_filling_every_section_lands_each_in_its_place(store):
    p, redis = 3, store.redis
    one, one_loaded = await registered_companion(store, "c-1")
    two, two_loaded = await registered_companion(store, "c-2")
    r = record("s-1", handle="explore_1a2b3c4d")
    # Items an earlier step left: one done now, one a claim may now take, one a claim no longer may.
    await redis.hset(keys.session_due(p, "s-1"), mapping={"m-3": encode_item(item("m-3", 1)),
                                                           "m-5": encode_item(item("m-5", 1))})
    await redis.hset(keys.session_mail(p, "s-1"), "m-4", encode_item(item("m-4", 1, "released")))
    stream, reply_list = keys.command_stream(0), keys.reply_list("client-1")
    await store.ensure_command_group(1)
    entry_id = await redis.xadd(stream, {"__data__": "{}"})
    await redis.xreadgroup(keys.COMMAND_GROUP, "w", {stream: ">"})

    loaded = await store.load(r)
    events = [registered(r), accepted("m-1"), accepted("m-2")]
    base = plan_commit(r, loaded.state, loaded.version, events)
    mail = [("m-1", item("m-1", 2), "new due"), ("m-2", item("m-2", 3), "new held"), ("m-3", None, ""),
            ("m-4", item("m-4", 1), "due"), ("m-5", item("m-5", 1, "claimed"), "held")]
    notice = item("n-1", 2)
    sources = [
        SourceWrite(one, [accepted("n-1")], one_loaded.state, ["m-1", "c-1 2"], [("n-1", notice, "new held")],
                    [(2, "n-1")], ("lt", 50.0)),
        SourceWrite(two, [ev.SessionStatusChanged(status="running")], two_loaded.state, [], [], [], ("del", None)),
    ]
    approval = {"req-1": (None, "approved")}
    applied = dataclasses.replace(base.applied, wakes=[(2, "m-1")], approvals=approval, tree_grants=["sibling"])
    plan = dataclasses.replace(
        base, applied=applied, mail=mail, due=("set", 123.5), sources=sources,
        idempotency=Idempotency("s-1", "ab" * 16, {"message_id": "m-1"}), read_draining=False,
        outbound=["m-9", "s-1 3"])
    await redis.zadd(keys.due_index(p), {"c-2": 7.0})
    reply = Reply(reply_list, '{"command_id":"c-1"}', stream, entry_id)
    prepared = store.prepare(plan, loaded, held={"c-1": one_loaded, "c-2": two_loaded}, reply=reply)

    result = await store.append(prepared)

    assert (result.status, result.version) == ("ok", 3)
    entries = await redis.xrange(keys.session_stream(p, "s-1"))
    assert [(i, f) for i, f in entries] == [
        (f"{n}-0".encode(), {b"type": t.encode(), b"data": d if isinstance(d, bytes) else d.encode(),
                             b"v": str(PROTOCOL_VERSION).encode()})
        for n, (t, d) in enumerate((ev.encode(e) for e in events), start=1)]
    state = await redis.hgetall(keys.session_snapshot(p, "s-1"))
    assert (state[b"version"], state[b"snapshot"].decode()) == (b"3", applied.state.to_json())
    assert state[b"etag"].decode() == prepared.loaded.etag
    assert await redis.hget(keys.tree_handles(p, "root-1"), "explore_1a2b3c4d") == b"s-1"
    assert {b"s-1"} <= await redis.smembers(keys.tree_members(p, "root-1"))
    assert {b"s-1", b"c-1", b"c-2"} <= await redis.smembers(keys.partition_sessions(p))
    assert await redis.hgetall(keys.session_due(p, "s-1")) == {
        b"m-1": encode_item(item("m-1", 2)).encode(), b"m-4": encode_item(item("m-4", 1)).encode()}
    assert await redis.hgetall(keys.session_mail(p, "s-1")) == {
        b"m-2": encode_item(item("m-2", 3)).encode(), b"m-5": encode_item(item("m-5", 1, "claimed")).encode()}
    wakes = [(f[b"session"], f[b"data"]) for _, f in await redis.xrange(keys.wake_stream(p))]
    assert [s for s, _ in wakes] == [b"s-1", b"c-1"]
    assert [b'"message_id":"m-1"' in d for _, d in wakes] == [True, False]
    assert b'"message_id":"n-1"' in wakes[1][1]
    assert await redis.hgetall(keys.approvals(p)) == {b"req-1:status": b"approved"}
    assert await redis.smembers(keys.tree_grants(p, "root-1")) == {b"sibling"}
    assert await redis.zrange(keys.due_index(p), 0, -1, withscores=True) == [(b"c-1", 50.0), (b"s-1", 123.5)]
    outbound = await redis.hgetall(keys.outbound_index(p))
    stored = encode_outbound(["m-1", "c-1 2"]) + encode_outbound(["m-9", "s-1 3"])
    assert outbound == {_bytes(stored[0]): _bytes(stored[1]), _bytes(stored[2]): _bytes(stored[3])}
    assert await redis.hget(keys.session_idempotency(p, "s-1"), record_field("ab" * 16)) \
        == encode_record({"message_id": "m-1"}).encode()

    companion = await redis.xrange(keys.session_stream(p, "c-1"))
    assert [i for i, _ in companion] == [b"1-0", b"2-0"]
    assert (await redis.hgetall(keys.session_snapshot(p, "c-1")))[b"version"] == b"2"
    assert await redis.hgetall(keys.session_mail(p, "c-1")) == {b"n-1": encode_item(notice).encode()}
    assert await redis.hgetall(keys.session_due(p, "c-1")) == {}
    assert [i for i, _ in await redis.xrange(keys.session_stream(p, "c-2"))] == [b"1-0", b"2-0"]
    assert (await redis.hgetall(keys.session_snapshot(p, "c-2")))[b"etag"].decode() == prepared.sources["c-2"].etag

    last = (await redis.xrevrange(keys.feed(p), count=1))[0][1]
    assert last == {b"v": str(PROTOCOL_VERSION).encode(), id_bytes("s-1"): b"1-3", id_bytes("c-1"): b"2",
                    id_bytes("c-2"): b"2"}
    assert await redis.lrange(reply_list, 0, -1) == [b'{"command_id":"c-1"}']
    assert 0 < await redis.ttl(reply_list) <= keys.REPLY_TTL_S
    assert (await redis.xpending(stream, keys.COMMAND_GROUP))["pending"] == 0


async def test_a_drain_begun_since_the_decision_read_it_is_a_conflict_and_writes_nothing(store):
    r = record("s-1")
    loaded = await store.load(r)
    await store.redis.set(keys.partition_drain(r.partition), "1")
    plan = dataclasses.replace(plan_commit(r, loaded.state, 0, [registered(r)]), read_draining=False)

    assert (await store.append(store.prepare(plan, loaded))).status == "conflict"
    assert await store.redis.xlen(keys.session_stream(r.partition, "s-1")) == 0


def _bytes(value) -> bytes:
    return value if isinstance(value, bytes) else value.encode()
