"""Issue 17: a message a decision creates is written once, in the hash that keeps it, and nothing is
removed from the other (it cannot be there): one server call fewer per send. Counted with the server's own
command statistics, so one server only (a cluster's are per node)."""

import pytest

from treemail.adapters.connection import connect
from treemail.adapters.eventstore import EventStore
from treemail.domain import events as ev

from .conftest import make_config
from .test_event_store_contract import record, registered, steer


@pytest.fixture
async def store(redis_url):
    config = make_config(redis_url)
    client = await connect(redis_url, config.service)
    store = EventStore(client, config.service)
    await store.load_scripts()
    yield store
    await client.aclose()


async def calls_during(store: EventStore, append) -> dict[str, int]:
    await store.redis.config_resetstat()
    await append
    stats = await store.redis.info("commandstats")
    return {name: stats.get(f"cmdstat_{name}", {}).get("calls", 0) for name in ("hset", "hdel")}


@pytest.mark.parametrize("new, writes", [(True, {"hset": 2, "hdel": 0}), (False, {"hset": 2, "hdel": 1})])
async def test_a_new_message_is_one_write_and_an_existing_one_also_leaves_the_other_hash(store, new, writes):
    r = record("s-1")
    await store.append(store.prepare(r, await store.load(r), [registered(r, "running")]))
    accepted: list[ev.Event] = [steer("m-1")]

    prepared = store.prepare(r, await store.load(r), accepted, new_mail=("m-1",) if new else ())

    # HSET: the state hash and the item; HDEL: the item's absence from the pending-mail hash, unless new.
    assert await calls_during(store, store.append(prepared)) == writes
    assert set(await store.load_mail(r, "due")) == {"m-1"}
