"""Worker metrics, scraped over HTTP from real workers deciding real sends.

prometheus_client metrics are process-global and other tests decide sends in
this process too, so every assertion is on the change between two scrapes.
"""

import asyncio
import contextlib
import urllib.request

from prometheus_client.parser import text_string_to_metric_families

from treemail.consumers.app import Worker
from treemail.adapters import keys
from treemail.adapters.commandclient import command_stream


from .conftest import Calls, adapters, close_host, connect_host, make_config


async def scrape(port: int) -> dict[tuple, float]:
    """(sample name, sorted labels) -> value, from the worker's /metrics over HTTP."""

    def get() -> str:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
            assert response.status == 200
            return response.read().decode()

    body = await asyncio.to_thread(get)
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(body)
        for sample in family.samples
    }


async def settled_scrape(port: int, before: dict, name: str, expected: float, timeout_s: float = 5.0) -> dict:
    """A scrape once ``name`` has grown by ``expected`` since ``before`` (or the last one at the deadline): a
    worker counts a decision just after its answer left, which an append may have pushed already."""
    deadline = asyncio.get_running_loop().time() + timeout_s
    while True:
        after = await scrape(port)
        if delta(before, after, name) >= expected or asyncio.get_running_loop().time() > deadline:
            return after
        await asyncio.sleep(0.05)


def delta(before: dict, after: dict, name: str, **labels) -> float:
    key = (name, tuple(sorted(labels.items())))
    return after.get(key, 0.0) - before.get(key, 0.0)


@contextlib.asynccontextmanager
async def metered_stack(url: str, workers: int = 1, **messaging):
    """Like conftest.running_stack, but every worker serves /metrics on a free port."""
    config = make_config(url, **messaging)
    pool = [Worker(config, url, consumer=f"metered-{i}", metrics_port=0) for i in range(workers)]
    try:
        for worker in pool:
            await worker.start()
        host = await connect_host(config, url)
        try:
            yield host, pool
        finally:
            await close_host(host)
    finally:
        for worker in pool:
            await worker.stop()


async def test_sends_are_counted_by_outcome_with_latency_and_batch_size(redis_url):
    calls = Calls()
    async with metered_stack(redis_url, max_pending_per_session=2) as (host, [worker]):
        root = await host.register_root("planner", "plans", rules={"child": "allow"})
        child = await host.register_child(root.session_id, "explore", "reads", rules={"parent": "allow"})
        await host.start_run(root.session_id, "run-1")
        before = await scrape(worker.metrics_port)

        results = [
            await host.send_message(calls.ctx(root.session_id), {"to": child.handle, "body": f"m{i}"})
            for i in range(3)
        ]
        unknown = await host.send_message(calls.ctx(root.session_id), {"to": "nobody_00000000", "body": "x"})
        after = await settled_scrape(worker.metrics_port, before, "treemail_decision_seconds_count", 4)

    assert ["message_id" in r for r in results] == [True, True, False]
    assert results[2]["error"]["code"] == "send_message:inbox_full"
    assert unknown["error"]["code"] == "send_message:unknown_session"
    assert delta(before, after, "treemail_sends_total", outcome="ok") == 2
    assert delta(before, after, "treemail_sends_total", outcome="send_message:inbox_full") == 1
    assert delta(before, after, "treemail_sends_total", outcome="send_message:unknown_session") == 1
    # One latency observation per command, one batch-size observation per batch.
    assert delta(before, after, "treemail_decision_seconds_count") == 4
    assert delta(before, after, "treemail_decision_seconds_sum") > 0
    assert delta(before, after, "treemail_decision_seconds_bucket", le="+Inf") == 4
    assert delta(before, after, "treemail_batch_size_sum") == 4
    assert 1 <= delta(before, after, "treemail_batch_size_count") <= 4
    assert ("treemail_conflict_retries_total", ()) in after
    assert after[("process_resident_memory_bytes", ())] > 0


async def test_stats_report_backlog_pending_consumers_and_waiting_approvals(redis_url):
    calls = Calls()
    async with metered_stack(redis_url) as (host, [worker]):
        root = await host.register_root("planner", "x", rules={"child": "allow"})
        rules = {"parent": "allow", "sibling": "ask"}
        a = await host.register_child(root.session_id, "explore", "a", rules=rules)
        b = await host.register_child(root.session_id, "review", "b", rules=rules)
        await host.start_run(a.session_id, "run-1")
        before = await scrape(worker.metrics_port)

        send = asyncio.create_task(host.send_message(calls.ctx(a.session_id), {"to": b.handle, "body": "may I?"}))
        while not (pending := await host.permissions.pending_approvals()):
            await asyncio.sleep(0.02)
        await worker.refresh_stats()
        waiting = await scrape(worker.metrics_port)
        await host.permissions.approve(pending[0]["request_id"], scope="once")
        assert "message_id" in await asyncio.wait_for(send, 10)
        await worker.refresh_stats()
        after = await scrape(worker.metrics_port)

    assert waiting[("treemail_approvals_pending", ())] == 1
    assert after[("treemail_approvals_pending", ())] == 0
    # The send was decided twice: once to ask, once after the approval.
    assert delta(before, after, "treemail_sends_total", outcome="approval_pending") == 1
    assert delta(before, after, "treemail_sends_total", outcome="ok") == 1
    for index in range(2):  # make_config: two command streams, both drained
        labels = (("stream", keys.command_stream(index)),)
        assert after[("treemail_command_backlog", labels)] == 0
        assert after[("treemail_command_pending", labels)] == 0
        assert after[("treemail_worker_consumers", labels)] == 1


async def test_backlog_counts_commands_no_worker_has_read(redis_url):
    """With the worker's subscribers stopped, sends pile up as lag on their command stream."""
    calls = Calls()
    async with metered_stack(redis_url) as (host, [worker]):
        root = await host.register_root("planner", "x", rules={"child": "allow"})
        child = await host.register_child(root.session_id, "explore", "a", rules={"parent": "allow"})
        await host.start_run(root.session_id, "run-1")
        await worker.broker.stop()  # the metrics server and the stats stay up
        sends = [
            asyncio.create_task(host.send_message(calls.ctx(root.session_id), {"to": child.handle, "body": str(i)}))
            for i in range(3)
        ]
        stream = command_stream(adapters(host).config.service, root.session_id)
        redis = adapters(host).redis
        while (await redis.xlen(stream)) < 3:
            await asyncio.sleep(0.02)
        await worker.refresh_stats()
        stalled = await scrape(worker.metrics_port)
        for send in sends:
            send.cancel()
        await asyncio.gather(*sends, return_exceptions=True)

    assert stalled[("treemail_command_backlog", (("stream", stream),))] == 3
    assert stalled[("treemail_command_pending", (("stream", stream),))] == 0


async def test_two_workers_in_one_process_serve_on_distinct_ports(redis_url):
    async with metered_stack(redis_url, workers=2) as (_, pool):
        ports = [worker.metrics_port for worker in pool]
        assert len(set(ports)) == 2 and all(ports)
        for port in ports:
            assert ("treemail_approvals_pending", ()) in await scrape(port)
