"""Round trips on lanes (``adapters.lanes``), against a real Valkey: a pipeline's answers, on kept connections."""

import asyncio

import pytest
import redis
import redis.asyncio as aioredis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import ConnectionError, ResponseError

from treemail.adapters.lanes import CommandBatch, Lanes


@pytest.fixture
async def client(redis_url):
    client = aioredis.Redis.from_url(redis_url)
    yield client
    await client.aclose()


def commands() -> list[tuple]:
    batch = CommandBatch()
    batch.execute_command("SET", "a", "1")
    batch.execute_command("HSET", "a", "f", "v")  # a string, not a hash: refused
    batch.hsetnx("h", "f", "x")
    batch.hget("h", "f")
    batch.execute_command("GET", "a")
    return batch.commands


async def test_a_round_trip_answers_as_a_pipeline_does_with_each_refusal_in_its_place(client):
    replies = await Lanes(client).run(commands())
    await client.delete("a", "h")
    async with client.pipeline(transaction=False) as pipe:
        for args in commands():
            pipe.execute_command(*args)
        expected = await pipe.execute(raise_on_error=False)

    assert isinstance(replies[1], ResponseError) and "WRONGTYPE" in str(replies[1])
    assert replies[:1] + replies[2:] == expected[:1] + expected[2:] == [True, True, b"x", b"1"]


async def test_connections_beyond_those_kept_go_back_to_the_pool(client, redis_url):
    lanes = Lanes(client, kept=2)
    await asyncio.gather(*[lanes.run([("BLPOP", "nothing", "0.2")]) for _ in range(6)])
    assert len(lanes.idle) == 2

    # The other four are the pool's again: taking four opens no connection to the server.
    observer = aioredis.Redis.from_url(redis_url)
    opened = len(await observer.client_list())
    pool = client.connection_pool
    taken = [await pool.get_connection() for _ in range(4)]
    assert len(await observer.client_list()) == opened
    for connection in taken:
        await pool.release(connection)
    await observer.aclose()


async def test_a_round_trip_cut_short_leaves_no_reply_for_the_next_one(client):
    lanes = Lanes(client, kept=1)
    waiting = asyncio.create_task(lanes.run([("BLPOP", "late", "2")]))
    await asyncio.sleep(0.2)
    waiting.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiting

    # Its connection was closed, and the server dropped the BLPOP with it: nothing takes this.
    await client.rpush("late", "item")
    await asyncio.sleep(0.1)
    assert await client.lrange("late", 0, -1) == [b"item"]
    # The lane reconnects, and reads its own reply, not the BLPOP's.
    assert await lanes.run([("GET", "missing"), ("PING",)]) == [None, True]
    assert len(lanes.idle) == 1


def kill(redis_url: str, client_id: int) -> None:
    """Close one connection from the server's side, without letting the event loop run (so the client
    has not seen the close yet when its next round trip starts)."""
    with redis.Redis.from_url(redis_url) as killer:
        killer.client_kill_filter(_id=client_id)


async def test_a_kept_connection_the_server_closed_meanwhile_is_reopened_before_use(client):
    lanes = Lanes(client)
    [first] = await lanes.run([("CLIENT", "ID")])
    await client.client_kill_filter(_id=first)  # a restart, say: the close arrives while the lane is idle
    await asyncio.sleep(0.1)

    assert await lanes.run([("INCR", "n"), ("GET", "n")]) == [1, b"1"]
    [second] = await lanes.run([("CLIENT", "ID")])
    assert second != first


async def test_a_connection_closed_under_a_round_trip_fails_it_and_is_reopened_for_the_next(client, redis_url):
    lanes = Lanes(client)
    [first] = await lanes.run([("CLIENT", "ID")])
    kill(redis_url, first)

    # As a pipeline's round trip would (the client is configured without retries): nothing applied.
    with pytest.raises(ConnectionError):
        await lanes.run([("INCR", "n")])
    assert await client.get("n") is None
    assert await lanes.run([("INCR", "n"), ("GET", "n")]) == [1, b"1"]


async def test_with_retries_configured_the_round_trip_is_made_again_whole_on_a_new_connection(redis_url):
    client = aioredis.Redis.from_url(redis_url, retry=Retry(NoBackoff(), 1))
    lanes = Lanes(client)
    [first] = await lanes.run([("CLIENT", "ID")])
    kill(redis_url, first)

    incremented, second = await lanes.run([("INCR", "n"), ("CLIENT", "ID")])
    assert incremented == 1 and second != first
    assert await client.get("n") == b"1"  # made once: the write on the closed connection never arrived
    await client.aclose()
