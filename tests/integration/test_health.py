"""Health, outages and what each process exports, on real processes against a server that goes away.

Each outage test has a Valkey of its own: it is killed and started again.
"""

import asyncio
import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request

from prometheus_client.parser import text_string_to_metric_families

from treemail.adapters import keys
from treemail.adapters.embedded import LocalValkey, free_port
from treemail.consumers.app import Worker
from treemail.domain.errors import Code
from treemail.host import Treemail
from treemail.projections.views import PROJECTIONS

from .conftest import Calls, WORKER_ENV, make_config, wait_for_workers


def get(port: int, path: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=3) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode()
    except OSError as error:
        return 0, str(error)


def samples(port: int) -> dict[tuple, float]:
    _, body = get(port, "/metrics")
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(body) for s in family.samples}


def wait_until(condition, timeout: float, what: str, interval: float = 0.1):
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        assert time.monotonic() < deadline, f"not within {timeout} s: {what}"
        time.sleep(interval)


def spawn(command: str, url: str, port: int, **env) -> subprocess.Popen:
    full = {**os.environ, **WORKER_ENV, "REDIS_URL": url, "TREEMAIL_LOG": "INFO", **env}
    full.pop("TREEMAIL_CONFIG", None)
    return subprocess.Popen([sys.executable, "-m", "treemail", command, "--metrics-port", str(port)], env=full,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)


def stop(process: subprocess.Popen) -> str:
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
    try:
        _, err = process.communicate(timeout=30)
    except subprocess.TimeoutExpired:
        process.kill()
        _, err = process.communicate()
    return err


def outage_lines(err: str, since: str) -> list[str]:
    return [line for line in err[err.index(since):].splitlines() if line.strip()] if since in err else []


def test_worker_readiness_follows_the_server_and_an_outage_is_a_few_lines_not_tracebacks():
    server = LocalValkey().start()  # no AOF: it comes back empty, without the consumer group
    port = free_port()
    worker = spawn("worker", server.url, port)
    try:
        wait_until(lambda: get(port, "/readyz")[0] == 200, 20, "worker ready")
        assert get(port, "/healthz") == (200, "alive\n")
        wait_until(lambda: samples(port).get(("treemail_worker_consumers", (("stream", keys.command_stream(0)),)))
                   == 1, 15, "the worker sees itself live")

        server.stop(kill=True)
        # Within a few probes (one a second) on a quiet machine; the deadline is far from a loaded one's.
        status, why = wait_until(lambda: (r := get(port, "/readyz"))[0] == 503 and r, 60, "not ready")
        assert "Connection" in why or "no answer" in why, why
        assert get(port, "/healthz")[0] == 200  # alive: restarting it would not bring the server back
        # The live-worker gauge falls: nobody reads while the server is gone.
        wait_until(lambda: samples(port).get(("treemail_worker_consumers", (("stream", keys.command_stream(0)),)))
                   == 0, 10, "live workers 0 during the outage")
        assert samples(port)[("treemail_workers_live", ())] == 0
        # The backlog lives on the server: unknown now, so absent, never a reassuring 0.
        backlog = ("treemail_command_backlog", (("stream", keys.command_stream(0)),))
        assert backlog not in samples(port) and ("treemail_command_pending", backlog[1]) not in samples(port)
        time.sleep(8)  # a reclaim pass (every reclaim_idle_ms / 2) and stats refreshes fail meanwhile

        server.start()
        wait_until(lambda: get(port, "/readyz")[0] == 200, 15, "ready again, the group recreated")
        wait_until(lambda: backlog in samples(port), 15, "the backlog known again")
    finally:
        err = stop(worker)
        server.cleanup()
    assert worker.returncode == 0, err
    assert "Traceback" not in err
    during = outage_lines(err, "server failing: Connection")
    assert during, err
    # One line when it broke and one when it healed (and the group recreated), not one per retry.
    assert len([line for line in during if "failing" in line]) <= 3, during
    assert any("server working again" in line for line in during), during
    assert len(during) <= 8, during


def test_projection_worker_rides_out_an_outage_and_folds_again():
    server = LocalValkey(durable=True).start()
    port = free_port()
    projections = spawn("projections", server.url, port)
    worker = spawn("worker", server.url, free_port())

    async def send_once(label: str) -> str:
        config = make_config(server.url)
        host = await Treemail.connect(config, server.url)
        try:
            root = await host.register_root("planner", label, rules={"child": "allow"})
            child = await host.register_child(root.session_id, "explore", "x")
            await host.start_run(root.session_id, "run-1")
            result = await host.send_message(Calls().ctx(root.session_id), {"to": child.handle, "body": label})
            assert "message_id" in result, result
            return root.session_id
        finally:
            await host.close()

    def folded(root: str) -> bool:
        key = ("treemail_projection_events_total", (("projection", "trees"),))
        return samples(port).get(key, 0) > 0 and _tree_known(server.url, root)

    try:
        wait_until(lambda: get(port, "/readyz")[0] == 200, 20, "projection worker ready")
        asyncio.run(wait_for_workers(server.url, 1))
        first = asyncio.run(send_once("before"))
        wait_until(lambda: folded(first), 15, "the first tree folded")

        server.stop(kill=True)
        wait_until(lambda: get(port, "/readyz")[0] == 503, 10, "projection worker not ready")
        assert projections.poll() is None, "the projection worker died with the server"
        time.sleep(3)
        server.start()
        wait_until(lambda: get(port, "/readyz")[0] == 200, 15, "projection worker ready again")
        asyncio.run(wait_for_workers(server.url, 1))
        second = asyncio.run(send_once("after"))
        wait_until(lambda: _tree_known(server.url, second), 15, "a tree made after the outage is folded")
    finally:
        err = stop(projections)
        stop(worker)
        server.cleanup()
    assert "Traceback" not in err, err
    assert "failing: NotReady" not in err  # catching up at start is not an outage
    during = outage_lines(err, "server failing: Connection")
    assert during and len(during) <= 4, err


def test_pump_readiness_follows_the_server_and_its_passes_resume_after_an_outage():
    server = LocalValkey().start()
    port = free_port()
    pump = spawn("pump", server.url, port)

    def passes() -> float:
        return samples(port).get(("treemail_pump_passes_total", ()), 0)

    try:
        wait_until(lambda: get(port, "/readyz") == (200, "ready\n"), 20, "pump ready (swept)")
        assert get(port, "/healthz") == (200, "alive\n")
        before = wait_until(passes, 10, "a pass counted")

        server.stop(kill=True)
        status, why = wait_until(lambda: (r := get(port, "/readyz"))[0] == 503 and r, 10, "pump not ready")
        assert "Connection" in why or "no answer" in why, why
        assert get(port, "/healthz")[0] == 200 and pump.poll() is None, "the pump died with the server"
        time.sleep(3)  # passes fail meanwhile, every interval

        server.start()
        wait_until(lambda: get(port, "/readyz")[0] == 200, 15, "pump ready again")
        during_outage = passes()
        wait_until(lambda: passes() > during_outage, 10, "passes counted again")
        assert during_outage >= before
    finally:
        err = stop(pump)
        server.cleanup()
    assert pump.returncode == 0, err
    assert "Traceback" not in err, err
    during = outage_lines(err, "server failing: Connection")
    assert any("server working again" in line for line in during), err
    assert len(during) <= 4, during


def _tree_known(url: str, root: str) -> bool:
    async def look():
        from treemail.adapters.viewstore import load_view
        from treemail.projections.views import tree_summaries
        import redis.asyncio as aioredis

        client = aioredis.Redis.from_url(url)
        try:
            for partition in range(16):
                view, _ = await load_view(client, partition, "trees")
                if root in tree_summaries(view):
                    return True
            return False
        finally:
            await client.aclose()

    try:
        return asyncio.run(look())
    except OSError:
        return False


async def test_each_process_exports_its_own_metrics_with_counters_at_zero(redis_url):
    config = make_config(redis_url)
    worker = Worker(config, redis_url, consumer="only-mine", metrics_port=0)
    await worker.start()
    projection_port = free_port()
    projections = spawn("projections", redis_url, projection_port)
    try:
        scraped = await asyncio.to_thread(samples, worker.metrics_port)
        names = {name for name, _ in scraped}
        assert not [n for n in names if n.startswith(("treemail_projection", "treemail_pending_agent_mail",
                                                       "treemail_inflight", "treemail_full_", "treemail_wakes"))]
        for outcome in ("ok", "approval_pending", *(c.value for c in Code)):
            assert ("treemail_sends_total", (("outcome", outcome),)) in scraped, outcome
        for reason in ("malformed", "max_deliveries"):
            assert ("treemail_dead_letters_total", (("reason", reason),)) in scraped, reason

        await asyncio.to_thread(wait_until, lambda: get(projection_port, "/readyz")[0] == 200, 20, "ready")
        theirs = await asyncio.to_thread(samples, projection_port)
        assert not [n for n, _ in theirs if n.startswith(("treemail_sends", "treemail_command", "treemail_worker",
                                                         "treemail_dead_letters", "treemail_approvals"))]
        for name in PROJECTIONS:
            assert ("treemail_projection_events_total", (("projection", name),)) in theirs, name
    finally:
        stop(projections)
        await worker.stop()


async def test_live_worker_gauge_falls_when_a_worker_dies(redis_url):
    config = make_config(redis_url)  # worker_timeout_ms 2000: a worker silent that long is not live
    observer = Worker(config, redis_url, consumer="observer", metrics_port=0)
    await observer.start()
    other = spawn("worker", redis_url, -1)
    streams = [(("stream", keys.command_stream(index)),) for index in range(config.service.command_streams)]
    try:
        await wait_for_workers(redis_url, 2)
        await observer.refresh_stats()
        seen = await asyncio.to_thread(samples, observer.metrics_port)
        assert seen[("treemail_workers_live", ())] == 2
        assert all(seen[("treemail_worker_consumers", stream)] >= 1 for stream in streams), seen
        os.kill(other.pid, signal.SIGKILL)
        other.wait()
        await asyncio.sleep(config.service.worker_timeout_ms / 1000 + 0.5)
        await observer.refresh_stats()
        seen = await asyncio.to_thread(samples, observer.metrics_port)
        assert seen[("treemail_workers_live", ())] == 1
        # The dead worker's stream is the observer's now: every stream still has a live reader.
        assert observer.owned == frozenset(range(config.service.command_streams))
        assert all(seen[("treemail_worker_consumers", stream)] == 1 for stream in streams), seen
    finally:
        stop(other)
        await observer.stop()


def test_json_logs_are_one_object_per_line(redis_url):
    port = free_port()
    worker = spawn("worker", redis_url, port, TREEMAIL_LOG_FORMAT="json")
    try:
        wait_until(lambda: get(port, "/readyz")[0] == 200, 20, "worker ready")
    finally:
        err = stop(worker)
    lines = [line for line in err.splitlines() if line.strip()]
    assert lines, "the worker logged nothing at INFO"
    records = [json.loads(line) for line in lines]
    assert any(re.search(r"deciding commands on redis://", r["message"]) for r in records), records
    assert all({"ts", "level", "logger", "message"} <= set(r) for r in records)
