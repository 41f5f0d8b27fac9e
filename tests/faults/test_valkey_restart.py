"""Scale-out and faults: the server itself is killed (SIGKILL) and restarted while senders run."""

import asyncio
import logging
import random
import time

import pytest
import redis.asyncio as redis

from treemail.adapters.embedded import LocalValkey
from treemail.host import SendContext, Treemail

from .helpers import (WorkerPool, build_tree, check_streams, code, config_for, consumer_idle_ms, histories,
                      load_until)

# Nothing is consumed: each sender may keep up to the largest per-source capacity unsettled.
MESSAGING = {"max_pending_per_session": 100000, "max_inflight_per_pair": 0, "max_outstanding_per_source": 1000}
DURABLE = {"TREEMAIL_SERVICE_PROFILE": "durable"}


@pytest.mark.slow
@pytest.mark.expected_duration_s(10)
async def test_valkey_restart_mid_load_with_durable_profile_loses_no_acknowledged_send():
    server = LocalValkey(durable=True).start()
    try:
        config = config_for(server.url, profile="durable", decision_timeout_s=5, **MESSAGING)
        async with WorkerPool(server.url, extra_env=DURABLE, **MESSAGING) as pool:
            await pool.start(2)
            workers = list(pool.started)
            host = await Treemail.connect(config, server.url)
            try:
                tree = await build_tree(host, [10])  # a root and 10 children, all running
                for session in tree.sessions:
                    await host.start_run(session, "run-1")  # only a session's open run may send
                successes = {}  # (sender, tool_call_id) -> (recipient, result, first sent at)
                failures = []  # (tool call, code) of every failed attempt
                killed_at = restarted_at = None
                spanned = []  # sends made before the kill and answered after it: they waited the outage out
                new_decided = []  # seconds after the restart at which each send first made after it was decided
                loading = asyncio.Event()
                loading.set()

                async def sender(n: int) -> None:
                    local = random.Random(n)
                    retries = []  # tool calls answered engine_shutdown: the SAME call is sent again later
                    count = 0
                    give_up = None
                    while loading.is_set() or retries:
                        if not loading.is_set():
                            give_up = give_up or time.monotonic() + 30
                            assert time.monotonic() < give_up, f"sender {n}: {len(retries)} sends never succeeded"
                        if retries and (retries[0][3] <= time.monotonic() or not loading.is_set()):
                            ctx, args, to, _, first_at = retries.pop(0)
                        elif loading.is_set():
                            me = local.choice(tree.sessions)
                            to = local.choice(tree.neighbours[me])
                            ctx = SendContext(me, "run-1", f"sender{n}-{count}")
                            args = {"to": tree.handles[to], "body": f"#{count} from {n}"}
                            first_at = time.monotonic()
                            count += 1
                        else:
                            await asyncio.sleep(0.1)
                            continue
                        result = await host.send_message(ctx, args)
                        if "message_id" in result:
                            successes[(ctx.session_id, ctx.tool_call_id)] = (to, result, first_at)
                            if restarted_at is not None and first_at > restarted_at:
                                new_decided.append(time.monotonic() - restarted_at)
                            if killed_at is not None and first_at < killed_at:
                                spanned.append(ctx.tool_call_id)
                        else:
                            failures.append((ctx.tool_call_id, code(result), time.monotonic() - first_at,
                                             result["error"]["message"]))
                            assert code(result) == "send_message:engine_shutdown", result
                            retries.append((ctx, args, to, time.monotonic() + 0.3, first_at))
                            await asyncio.sleep(0.05)

                async def outage() -> None:
                    nonlocal killed_at, restarted_at
                    await asyncio.sleep(2.5)
                    before = len(successes)
                    await asyncio.to_thread(server.stop, True)  # SIGKILL: no shutdown, no final fsync
                    killed_at = time.monotonic()  # the server is gone: nothing is answered until it is back
                    await asyncio.sleep(1.0)
                    await asyncio.to_thread(server.start)  # same port, same directory: the AOF is loaded
                    restarted_at = time.monotonic()
                    assert before > 0
                    # The load goes on until 100 sends first made after the restart were decided.
                    await load_until(lambda: len(new_decided) >= 100, 2, what="the sends after the restart")
                    loading.clear()

                await asyncio.gather(outage(), *(sender(n) for n in range(6)))
                all_histories = await histories(host, tree.sessions)
                # The worker processes reconnected by themselves: still alive, still reading commands.
                assert [p.poll() for p in workers] == [None, None], [pool.output(p) for p in workers]
                idle = await consumer_idle_ms(server.url, config.service.command_streams)
                names = [name for name in idle if any(name.endswith(f"-{p.pid}") for p in workers)]
                assert len(names) == 2 and all(idle[name] < 2000 for name in names), idle
            finally:
                await host.close()
            assert pool.started == workers  # nobody restarted a worker
    finally:
        server.cleanup()

    results = [(sender, "run-1", call, to, result) for (sender, call), (to, result, _) in successes.items()]
    check_streams(all_histories, results, MESSAGING, set())
    after_restart = [k for k, (_, _, at) in successes.items() if at > restarted_at]
    print(f"\nvalkey kill -9 + restart: {len(successes)} sends acknowledged, {len(failures)} attempts answered "
          f"engine_shutdown and retried, {len(spanned)} made before the kill answered after it, "
          f"{len(after_restart)} new sends decided after the restart")
    print(f"first send made after the restart decided {new_decided[0]:.2f} s after it; "
          f"the 100th {new_decided[min(99, len(new_decided) - 1)]:.2f} s after it")
    # Sends first made after the restart were decided (only the worker processes decide).
    assert len(after_restart) >= 100
    # The outage hit sends in flight: answered engine_shutdown (and retried), or waited it out and decided after.
    assert failures or spanned


@pytest.mark.slow
@pytest.mark.expected_duration_s(10)
async def test_workers_decide_new_sends_promptly_after_a_short_server_outage():
    server = LocalValkey(durable=True).start()  # AOF: the command streams and their group survive the restart
    try:
        config = config_for(server.url, decision_timeout_s=15, **MESSAGING)
        async with WorkerPool(server.url, **MESSAGING) as pool:
            await pool.start(1)
            host = await Treemail.connect(config, server.url)
            try:
                tree = await build_tree(host, [1])
                root, child = tree.sessions
                await host.start_run(root, "run-1")
                sent = await host.send_message(SendContext(root, "run-1", "before"), {"to": tree.handles[child],
                                                                                     "body": "x"})
                assert "message_id" in sent
                await asyncio.sleep(1.5)  # everysec: the group and streams are in the append-only file
                await asyncio.to_thread(server.stop, True)
                await asyncio.sleep(0.3)  # the worker's blocking read fails
                await asyncio.to_thread(server.start)
                await asyncio.sleep(0.5)  # the server is back and answers
                for _ in range(20):  # the host's pooled connections died with the server: the same call again
                    started = time.monotonic()
                    after = await host.send_message(SendContext(root, "run-1", "after"),
                                                    {"to": tree.handles[child], "body": "y"})
                    latency = time.monotonic() - started
                    if "unreachable" not in after.get("error", {}).get("message", ""):
                        break
                assert [p.poll() for p in pool.started] == [None]
            finally:
                await host.close()
    finally:
        server.cleanup()
    # Decided, not answered engine_shutdown at its decision deadline: the workers read again by themselves.
    assert "message_id" in after, after
    print(f"\nfirst send after a 0.3 s outage decided in {latency:.2f} s")


async def _flush_and_destroy_group(server) -> None:
    """The data lost while the server stays up (FLUSHALL): a subscriber's next read meets NOGROUP at once."""
    client = redis.from_url(server.url)
    try:
        await client.flushall()
    finally:
        await client.aclose()


async def _restart_empty(server) -> None:
    """SIGKILL and a start with no persistence: the server comes back with nothing."""
    await asyncio.to_thread(server.stop, True)
    await asyncio.to_thread(server.start)


@pytest.mark.slow
@pytest.mark.expected_duration_s(5)
@pytest.mark.parametrize("lose_data", [_restart_empty, _flush_and_destroy_group], ids=["restart", "flushall"])
async def test_worker_recovers_when_the_server_comes_back_empty(lose_data, caplog):
    """No persistence: the consumer group is gone. Whichever meets the loss first (the worker's probe, or a
    subscriber's read answered NOGROUP), the worker decides new commands again and says so once in its log."""
    from treemail.consumers.app import Worker
    from tests.integration.conftest import Calls, make_config

    caplog.set_level(logging.WARNING, logger="treemail.worker")
    server = LocalValkey(durable=False).start()
    try:
        config = make_config(server.url)
        worker = Worker(config, server.url, consumer="survivor")
        await worker.start()
        try:
            await lose_data(server)
            # The worker meets the loss by itself (a host connecting would recreate the group for it).
            give_up = time.monotonic() + 120
            while not healed(caplog):
                assert time.monotonic() < give_up, "the worker never said it had recreated the consumer group"
                await asyncio.sleep(0.05)
            host = await Treemail.connect(config, server.url)
            try:
                root = await host.register_root("planner", "x", rules={"child": "allow"})
                child = await host.register_child(root.session_id, "explore", "x")
                await host.start_run(root.session_id, "run-1")
                ctx = Calls().ctx(root.session_id)
                result = {}
                for _ in range(20):  # the first sends may meet connections that died with the server
                    result = await host.send_message(ctx, {"to": child.handle, "body": "after the flood"})
                    if "message_id" in result:
                        break
                # Only a worker decides: an answer with a message id is this worker reading commands again.
                assert "message_id" in result, result
                assert len(await host.obligations.pending_mail(child.session_id)) == 1
            finally:
                await host.close()
        finally:
            await worker.stop()
    finally:
        server.cleanup()
    assert len(healed(caplog)) == 1, healed(caplog)


def healed(caplog) -> list[str]:
    """The worker's log lines saying it found the consumer group gone and reads commands again."""
    return [r.getMessage() for r in caplog.records if "lost the command streams' consumer group" in r.getMessage()]
