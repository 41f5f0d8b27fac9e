"""The replicated profile on one primary with a replica: success only once the replica has the append; a
replica that does not confirm in time gives a stable code, and the same tool call retried resolves it from
its idempotency record, never by a second append."""

import contextlib
import time

import pytest
import redis.asyncio as aioredis

from treemail.adapters import keys
from treemail.adapters.config import Config, MessagingConfig, ServiceConfig
from treemail.adapters.embedded import LocalValkey
from treemail.adapters.eventstore import decode_entry
from treemail.adapters.replication import NotReplicated, online_replicas
from treemail.consumers.app import Worker
from treemail.domain import events as ev
from treemail.domain.errors import RedisUnavailable
from treemail.host import SendContext

from .conftest import WORKER_TIMEOUT_MS, one_send, running_stack, server_of

REPLICA_TIMEOUT_MS = 300


def replicated_config(url: str) -> Config:
    return Config(messaging=MessagingConfig(), service=ServiceConfig(
        redis_url=url, command_streams=2, reclaim_idle_ms=500, worker_timeout_ms=WORKER_TIMEOUT_MS,
        decision_timeout_s=10, profile="replicated", min_replicas=1, replica_timeout_ms=REPLICA_TIMEOUT_MS,
    ))


@pytest.fixture
def primary_and_replica():
    primary = LocalValkey().start()
    replica = LocalValkey(config={"replicaof": f"127.0.0.1 {primary.port}"}).start()
    try:
        yield primary, replica
    finally:
        replica.cleanup()
        primary.cleanup()


async def _replicas_connected(url: str, count: int) -> None:
    client = aioredis.Redis.from_url(url)
    try:
        deadline = time.monotonic() + 10
        while online_replicas(await client.info("replication")) < count:
            assert time.monotonic() < deadline, "the replica never connected"
            time.sleep(0.05)
    finally:
        await client.aclose()


@contextlib.asynccontextmanager
async def replicated_family(primary):
    """A worker and a host in the replicated profile on ``primary`` (its replica connected), a planner with
    its run open and a child: what each test here sends between."""
    await _replicas_connected(primary.url, 1)
    config = replicated_config(primary.url)
    async with running_stack(primary.url, config=config) as host:
        root = await host.register_root("planner", "x", rules={"child": "allow"})
        child = await host.register_child(root.session_id, "explore", "x")
        await host.start_run(root.session_id, "run-1")
        yield host, config, root, child


async def test_replicated_profile_acknowledges_a_send_the_replica_already_has(primary_and_replica):
    primary, replica = primary_and_replica
    async with replicated_family(primary) as (host, config, root, child):
        result = await host.send_message(SendContext(root.session_id, "run-1", "c1"),
                                         {"to": child.handle, "body": "on two machines"})
        assert "message_id" in result, result
        # Read from the replica alone: the acknowledged append is there already (WAIT came before the answer).
        async with server_of(primary.url, config) as server:
            record = await server.store.directory.get(child.session_id)
        on_replica = aioredis.Redis.from_url(replica.url)
        try:
            entries = await on_replica.xrange(keys.session_stream(record.partition, child.session_id))
        finally:
            await on_replica.aclose()
        events = [decode_entry(fields) for _, fields in entries]
        assert [e.message_id for e in events if isinstance(e, ev.ProducerMessageAccepted)] == [result["message_id"]]


async def test_a_replica_that_does_not_confirm_gives_not_replicated_and_the_retry_resolves_it(primary_and_replica):
    primary, replica = primary_and_replica
    async with replicated_family(primary) as (host, config, root, child):
        replica.stop(kill=True)
        ctx = SendContext(root.session_id, "run-1", "while-the-replica-is-gone")
        started = time.monotonic()
        first = await host.send_message(ctx, {"to": child.handle, "body": "unconfirmed"})
        waited = time.monotonic() - started
        assert first["error"]["code"] == "send_message:not_replicated", first
        assert "Retrying this same tool call is safe" in first["error"]["message"]
        assert waited < 5, f"the bounded wait took {waited:.1f} s"
        # A step the host makes itself waits for the replicas too, and says so with the same code.
        with pytest.raises(NotReplicated) as unconfirmed:
            await host.set_status(child.session_id, "idle")
        assert unconfirmed.value.code.value == "send_message:not_replicated"
        replica.start()
        await _replicas_connected(primary.url, 1)
        again = await host.send_message(ctx, {"to": child.handle, "body": "unconfirmed"})
        assert "message_id" in again, again
        history = await host.history(child.session_id)
        accepted = [e for _, e in history if isinstance(e, ev.ProducerMessageAccepted) and e.owner == "agent"]
        # The first append was kept on the primary: the retry answered from its record, not a second append.
        assert [e.message_id for e in accepted] == [again["message_id"]]


async def test_replicated_profile_refuses_a_server_without_replicas():
    server = LocalValkey().start()
    try:
        config = replicated_config(server.url)
        worker = Worker(config, server.url, consumer="refused")
        with pytest.raises(RedisUnavailable, match="min_replicas = 1 replica"):
            await worker.start()
        await worker.redis.aclose()
    finally:
        server.cleanup()


def test_cluster_command_with_replicas_starts_a_replicated_stack():
    import asyncio
    import re
    import signal
    import subprocess
    import sys

    process = subprocess.Popen([sys.executable, "-m", "treemail", "cluster", "--workers", "1", "--replicas", "1"],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               env={k: v for k, v in __import__("os").environ.items()
                                    if k not in ("REDIS_URL", "TREEMAIL_SERVICE_PROFILE")})
    try:
        out = ""
        while "Ctrl-C" not in out:
            line = process.stdout.readline()
            assert line, process.stderr.read()
            out += line
        url = re.search(r"REDIS_URL=(\S+)", out).group(1)
        assert "workers run profile = replicated" in out
        assert len(re.findall(r"127\.0\.0\.1:(\d+)", out.split("with 1 replica(s) each:")[1].splitlines()[0])) == 3

        config = Config(service=ServiceConfig(redis_url=url, cluster=True, profile="replicated"))
        assert "message_id" in asyncio.run(one_send(config, url))
    finally:
        process.send_signal(signal.SIGINT)
        stdout, stderr = process.communicate(timeout=60)
    assert process.returncode == 0, stderr
