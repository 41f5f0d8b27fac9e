"""The event store's contract, one suite for every backend: `make test` runs it on one Valkey and on
the 3-master cluster (marker ``cluster``).

What the commit step promises: an append applies whole or not at all; it applies only on the etag
the caller decided on; a chained append fails when the one it was built on did not apply; an
idempotency key is written once; a handle has one owner per tree (a session without one still joins
its tree); each pending item is kept once, in the due hash while a claim may take it; the feed entry,
the wake trigger and the indexes are written in the same step as their events.
"""

import json

import pytest

from treemail.adapters import approvalindex, feed, keys
from treemail.domain.protocol import PROTOCOL_VERSION
from treemail.adapters.connection import connect
from treemail.adapters.eventstore import EventStore, parse_append
from treemail.domain import events as ev
from treemail.domain.commitplan import Idempotency, plan_commit
from treemail.domain.records import SessionRecord

from ..conftest import CLUSTER
from .conftest import make_config

pytestmark = pytest.mark.cluster


def record(session_id: str, handle: str | None = "explore_0000aaaa", root: str | None = None) -> SessionRecord:
    return SessionRecord(
        session_id=session_id, root_session_id=root or "root-1", parent_session_id=None, agent_type="explore",
        description="", handle=handle, rules=[("*", "allow")], send_message_tool=True, partition=3,
    )


def registered(r: SessionRecord, status: str = "idle") -> ev.SessionRegistered:
    return ev.SessionRegistered(
        session_id=r.session_id, root_session_id=r.root_session_id, parent_session_id=None, agent_type="explore",
        description="", handle=r.handle, rules=r.rules, send_message_tool=True, status=status,
    )


def accepted(message_id: str) -> ev.ProducerMessageAccepted:
    return ev.ProducerMessageAccepted(message_id=message_id, producer_id="goal:host", owner="goal", body="b",
                                      mode="queue")


def prepare(store: EventStore, r: SessionRecord, loaded, events, *, idempotency_digest: str | None = None,
            idempotency_record=None, idempotency_session: str | None = None, reply=None, **plan):
    """The commit plan for ``events`` (``plan_commit``), laid out by the store as one append."""
    kept = None
    if idempotency_digest:
        kept = Idempotency(idempotency_session or r.session_id, idempotency_digest, idempotency_record)
    return store.prepare(plan_commit(r, loaded.state, loaded.version, events, idempotency=kept, **plan), loaded,
                         reply=reply)


@pytest.fixture
async def store(redis_url):
    config = make_config(redis_url)
    client = await connect(redis_url, config.service)
    store = EventStore(client, config.service)
    await store.load_scripts()
    yield store
    await client.aclose()


async def stream_length(store: EventStore, r: SessionRecord) -> int:
    return await store.redis.xlen(keys.session_stream(r.partition, r.session_id))


async def test_an_append_on_a_stale_etag_is_a_conflict_and_writes_nothing(store):
    r = record("s-1")
    stale = await store.load(r)
    assert (await store.append(prepare(store, r, stale, [registered(r)]))).status == "ok"

    result = await store.append(prepare(store, r, stale, [registered(r)]))

    assert result.status == "conflict"
    assert await stream_length(store, r) == 1


async def test_a_chained_append_fails_when_the_one_it_was_built_on_did_not_apply(store):
    r = record("s-1")
    await store.append(prepare(store, r, await store.load(r), [registered(r, "running")]))
    fresh = await store.load(r)
    other_writer = prepare(store, r, fresh, [ev.SessionStatusChanged(status="queued")])
    first = prepare(store, r, fresh, [accepted("m-1")])
    second = prepare(store, r, first.loaded, [accepted("m-2")])
    assert (await store.append(other_writer)).status == "ok"

    replies = await store.run_pipeline(lambda pipe: [store.commit_call(p, pipe) for p in (first, second)])

    assert [parse_append(reply).status for reply in replies[:2]] == ["conflict", "conflict"]
    assert [type(e) for _, e in await store.read(r)] == [ev.SessionRegistered, ev.SessionStatusChanged]


async def test_a_held_state_is_used_only_while_the_server_still_shows_the_append_that_wrote_it(store):
    """The worker keeps the states it wrote or parsed; another writer's append must show."""
    r = record("s-1")
    other = EventStore(store.redis, store.config)
    await store.append(prepare(store, r, await store.load(r), [registered(r, "running")]))
    mine = await store.load(r)
    assert (await store.load(r)).state is mine.state  # held: not parsed again

    failed = prepare(store, r, mine, [ev.SessionStatusChanged(status="idle")])  # held under an etag never written
    assert (await other.append(prepare(other, r, await other.load(r), [ev.SessionStatusChanged(status="queued")]))
            ).status == "ok"
    assert (await store.append(failed)).status == "conflict"

    assert (await store.load(r)).state.status == "queued"


async def test_an_idempotency_key_is_written_once_and_a_duplicate_returns_the_first_record(store):
    r = record("s-1")
    await store.append(prepare(store, r, await store.load(r), [registered(r)]))
    first = prepare(store, r, await store.load(r), [accepted("m-1")], idempotency_digest="k", idempotency_record={"n": 1})
    assert (await store.append(first)).status == "ok"

    again = prepare(store, r, await store.load(r), [accepted("m-2")], idempotency_digest="k",
                          idempotency_record={"n": 2})
    result = await store.append(again)

    assert (result.status, result.record) == ("dup", {"n": 1})
    assert await stream_length(store, r) == 2


async def test_a_step_that_fails_a_check_leaves_no_idempotency_record(store):
    """A conflict or a taken handle keeps no record: the tool call's retry is decided again, not answered."""
    r, taken = record("s-1"), record("s-2")
    await store.append(prepare(store, taken, await store.load(taken), [registered(taken)]))
    await store.append(prepare(store, r, await store.load(r), [registered(r, "running")]))
    stale = await store.load(r)
    await store.append(prepare(store, r, stale, [ev.SessionStatusChanged(status="idle")]))
    idempotency = keys.session_idempotency(3, "s-1")

    on_stale = prepare(store, r, stale, [accepted("m-1")], idempotency_digest="k", idempotency_record={"n": 1})
    handle_taken = prepare(store, record("s-3"), await store.load(record("s-3")), [registered(record("s-3"))],
                                 idempotency_digest="h", idempotency_record={"n": 2}, idempotency_session="s-1")

    assert (await store.append(on_stale)).status == "conflict"
    assert (await store.append(handle_taken)).status == "handle_taken"
    assert await store.redis.hgetall(idempotency) == {}
    retried = prepare(store, r, await store.load(r), [accepted("m-1")], idempotency_digest="k",
                            idempotency_record={"n": 3})
    assert (await store.append(retried)).status == "ok"
    assert json.loads(await store.redis.hget(idempotency, "k")) == {"n": 3}


async def test_a_handle_has_one_owner_per_tree_and_a_taken_one_writes_nothing(store):
    first, second = record("s-1"), record("s-2")
    assert (await store.append(prepare(store, first, await store.load(first), [registered(first)]))).status == "ok"

    result = await store.append(prepare(store, second, await store.load(second), [registered(second)]))

    assert result.status == "handle_taken"
    assert await stream_length(store, second) == 0
    assert not (await store.load(second)).state.registered
    owner = await store.redis.hget(keys.tree_handles(3, "root-1"), first.handle)
    assert owner == b"s-1"


async def test_a_registration_without_a_handle_joins_its_tree_and_reserves_no_handle(store):
    old, other = record("s-1", handle=None), record("s-2", handle=None)
    for r in (old, other):
        assert (await store.append(prepare(store, r, await store.load(r), [registered(r)]))).status == "ok"

    assert set(await store.directory.tree_members(3, "root-1")) == {"s-1", "s-2"}
    assert await store.redis.smembers(keys.partition_sessions(3)) == {b"s-1", b"s-2"}
    assert await store.redis.hgetall(keys.tree_handles(3, "root-1")) == {}


async def test_the_feed_entry_and_the_wake_trigger_are_written_in_the_same_step_as_their_events(store):
    r = record("s-1")
    await store.append(prepare(store, r, await store.load(r), [registered(r, "idle")]))
    wake = ev.SessionWakeRequested(message_id="m-1")

    await store.append(prepare(store, r, await store.load(r), [accepted("m-1"), wake]))

    feed = await store.redis.xrange(keys.feed(3))
    # One entry per step, naming the session and the positions it appended; no copy of the events.
    v = str(PROTOCOL_VERSION).encode()
    assert [f for _, f in feed] == [{b"v": v, b"~s-1": b"1"}, {b"v": v, b"~s-1": b"2-3"}]
    [(_, trigger)] = await store.redis.xrange(keys.wake_stream(3))
    assert json.loads(trigger[b"data"]) == {"session_id": "s-1", "root_session_id": "root-1", "message_id": "m-1",
                                           "seq": 3}
    assert set(await store.redis.hkeys(keys.session_mail(3, "s-1"))) == {b"m-1"}


def steer(message_id: str) -> ev.ProducerMessageAccepted:
    return ev.ProducerMessageAccepted(message_id=message_id, producer_id="goal:host", owner="goal", body="b",
                                      mode="steer")


async def hash_fields(store: EventStore, key: str) -> set[str]:
    return {field.decode() for field in await store.redis.hkeys(key)}


async def test_an_item_is_kept_once_in_the_due_hash_while_a_claim_may_take_it_then_in_the_mail_hash(store):
    """Each pending item has one copy, in the due hash while it is claimable, else the mail hash."""
    r = record("s-1")
    due_key, held_key = keys.session_due(3, "s-1"), keys.session_mail(3, "s-1")
    await store.append(prepare(store, r, await store.load(r), [registered(r, "running")]))
    await store.append(prepare(store, r, await store.load(r), [steer("s-1"), steer("s-2"), accepted("q-1")],
                                     new_mail=("s-1", "s-2", "q-1")))
    assert (await hash_fields(store, due_key), await hash_fields(store, held_key)) == ({"s-1", "s-2"}, {"q-1"})
    assert set(await store.load_mail(r, "due")) == {"s-1", "s-2"}
    assert set(await store.load_mail(r, "all")) == {"s-1", "s-2", "q-1"}

    claimed = ev.ProducerMessageClaimed(message_id="s-1", owner="goal", run_id="run-1")
    consumed = ev.ProducerMessageConsumed(message_id="s-2", owner="goal", run_id="run-1")
    await store.append(prepare(store, r, await store.load(r), [claimed, consumed], mail=await store.load_mail(r)))

    assert (await hash_fields(store, due_key), await hash_fields(store, held_key)) == (set(), {"s-1", "q-1"})
    assert await store.load_mail(r, "due") == {}
    items = await store.load_mail_items(r, ["s-1", "s-2", "q-1"])
    assert {m: item.state for m, item in items.items()} == {"s-1": "claimed", "q-1": "accepted"}
    # Kept in its least form; what an earlier version wrote (the owner second) still reads the same.
    assert json.loads(await store.redis.hget(held_key, "q-1"))[:2] == [items["q-1"].seq, items["q-1"].since]
    await store.redis.hset(held_key, "q-1", items["q-1"].to_json())
    assert (await store.load_mail_items(r, ["q-1"]))["q-1"] == items["q-1"]


async def calls_during(store: EventStore, append) -> dict[str, int]:
    await store.redis.config_resetstat()
    await append
    stats = await store.redis.info("commandstats")
    return {name: stats.get(f"cmdstat_{name}", {}).get("calls", 0) for name in ("hset", "hdel")}


@pytest.mark.skipif(CLUSTER, reason="counted with INFO commandstats, which a cluster keeps per node")
@pytest.mark.parametrize("new, writes", [(True, {"hset": 2, "hdel": 0}), (False, {"hset": 2, "hdel": 1})])
async def test_a_new_message_is_one_write_and_an_existing_one_also_leaves_the_other_hash(store, new, writes):
    """A message the decision creates (a send's new id) is in neither hash yet: one server call fewer."""
    r = record("s-1")
    await store.append(prepare(store, r, await store.load(r), [registered(r, "running")]))

    prepared = prepare(store, r, await store.load(r), [steer("m-1")], new_mail=("m-1",) if new else ())

    # HSET: the state hash and the item; HDEL: the item's absence from the pending-mail hash, unless new.
    assert await calls_during(store, store.append(prepared)) == writes
    assert set(await store.load_mail(r, "due")) == {"m-1"}


async def test_an_older_due_hash_that_names_its_items_still_reads_and_moves_to_one_copy(store):
    """Written by an earlier version: the due hash held the id alone ("1"), the mail hash every item."""
    r = record("s-1")
    due_key, held_key = keys.session_due(3, "s-1"), keys.session_mail(3, "s-1")
    await store.append(prepare(store, r, await store.load(r), [registered(r, "running")]))
    await store.append(prepare(store, r, await store.load(r), [steer("s-1"), steer("s-2")], new_mail=("s-1", "s-2")))
    old_layout = await store.redis.hgetall(due_key)
    await store.redis.hset(held_key, mapping=old_layout)
    await store.redis.hset(due_key, mapping={"s-1": "1", "s-2": "1"})

    assert set(await store.load_mail(r, "due")) == {"s-1", "s-2"}
    assert set(await store.load_mail(r, "all")) == {"s-1", "s-2"}
    assert set(await store.load_mail_items(r, ["s-2"])) == {"s-2"}

    claimed = ev.ProducerMessageClaimed(message_id="s-1", owner="goal", run_id="run-1")
    await store.append(prepare(store, r, await store.load(r), [claimed], mail=await store.load_mail(r, "due")))

    assert await store.redis.hget(due_key, "s-2") == b"1"
    assert (await hash_fields(store, due_key), await hash_fields(store, held_key)) == ({"s-2"}, {"s-1", "s-2"})
    assert (await store.load_mail_items(r, ["s-1"]))["s-1"].state == "claimed"
    assert set(await store.load_mail(r, "due")) == {"s-2"}


async def test_a_feed_batch_reads_its_wanted_events_from_the_session_streams(store):
    a, b = record("s-a"), record("s-b", handle="explore_0000bbbb")
    for r in (a, b):
        await store.append(prepare(store, r, await store.load(r), [registered(r, "running")]))
    await store.append(prepare(store, a, await store.load(a), [accepted("m-1"), accepted("m-2")]))
    await store.append(prepare(store, b, await store.load(b), [accepted("m-3")]))
    # An entry written before feeds stopped carrying data, and one whose stream is gone (retention).
    name, data = ev.encode(accepted("m-old"))
    await store.redis.xadd(keys.feed(3), {"session": "s-old", "seq": "1", "type": name, "data": data, "v": "2"})
    await store.redis.xadd(keys.feed(3), {"session": "s-gone", "seq": "1", "type": name, "v": "2"})

    entries = await feed.resolve(store.redis, 3, await store.redis.xrange(keys.feed(3)),
                                 lambda type_name: type_name == "ProducerMessageAccepted")

    assert [(e.index, e.last) for e in entries] == [(0, True), (0, True), (0, False), (1, True), (0, True),
                                                    (0, True), (0, True)]
    assert [(e.session_id, e.seq, e.type_name) for e in entries] == [
        ("s-a", 1, "SessionRegistered"), ("s-b", 1, "SessionRegistered"), ("s-a", 2, "ProducerMessageAccepted"),
        ("s-a", 3, "ProducerMessageAccepted"), ("s-b", 2, "ProducerMessageAccepted"),
        ("s-old", 1, "ProducerMessageAccepted"), ("s-gone", 1, "ProducerMessageAccepted"),
    ]
    assert [e.event.message_id if e.event else None for e in entries] == [
        None, None, "m-1", "m-2", "m-3", "m-old", None,  # not wanted: not read
    ]


async def test_an_approval_request_and_its_index_entry_are_one_step(store):
    r = record("s-1")
    await store.append(prepare(store, r, await store.load(r), [registered(r, "running")]))
    request = ev.ApprovalRequested(
        request_id="q-1", key="k", fingerprint="f", sender_session_id="s-1", sender_handle=r.handle,
        recipient_session_id="s-2", recipient_handle="review_0000bbbb", label="sibling", body="hi", mode="steer",
    )
    await store.append(prepare(store, r, await store.load(r), [request]))
    assert (await approvalindex.find(store.redis, "q-1", 16))["status"] == "pending"

    grant = ev.ApprovalGranted(request_id="q-1", key="k", scope="tree", label="sibling")
    await store.append(prepare(store, r, await store.load(r), [grant]))

    assert (await approvalindex.find(store.redis, "q-1", 16))["status"] == "approved"
    assert await store.redis.smembers(keys.tree_grants(3, "root-1")) == {b"sibling"}
    assert (await store.load(r)).state.approvals["k"].status == "approved"


def connections_of(client) -> list:
    if hasattr(client, "get_nodes"):
        return [c for node in client.get_nodes() for c in node._connections]
    return list(client.connection_pool._in_use_connections) + list(client.connection_pool._available_connections)


async def test_commands_are_packed_by_hiredis_and_arrive_unchanged(store):
    """The asyncio client's Python packer was a fifth of a worker's CPU; the fast packer must send the same
    values (text, non-ASCII text, bytes, ints, floats) and refuse the same ones (None, bool)."""
    from redis.exceptions import DataError

    from treemail.adapters.connection import _HiredisPacking

    key = keys.session_snapshot(3, "pack-check")
    values = {"text": "plain", "accents": "é ü 中文 🙂", "raw": b"\x00\xff", "int": 12345678901234, "float": 0.1 + 0.2,
              "buffer": bytearray(b"ab"), "view": memoryview(b"cd")}
    await store.redis.hset(key, mapping=values)
    stored = await store.redis.hgetall(key)
    assert stored == {b"text": b"plain", b"accents": "é ü 中文 🙂".encode(), b"raw": b"\x00\xff",
                      b"int": b"12345678901234", b"float": repr(0.1 + 0.2).encode(), b"buffer": b"ab",
                      b"view": b"cd"}
    for bad in (None, True):
        with pytest.raises(DataError):
            await store.redis.hset(key, "bad", bad)
    used = connections_of(store.redis)
    assert used and all(isinstance(c, _HiredisPacking) for c in used)


async def test_a_server_that_lost_its_scripts_still_commits_and_the_append_applies_once(store):
    """A restarted server has no script cache: the commit script is loaded again and the append runs once."""
    r = record("s-1")
    await store.redis.script_flush()
    assert (await store.append(prepare(store, r, await store.load(r), [registered(r)]))).status == "ok"
    assert await stream_length(store, r) == 1
