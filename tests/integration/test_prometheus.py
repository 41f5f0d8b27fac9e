"""A real Prometheus server scraping a real `treemail worker` process, and promtool on deploy/.

Needs Debian's prometheus package (server and promtool); `make test` installs
it when run as root and online, and these tests skip, saying why, without it.
"""

import asyncio
import contextlib
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from pathlib import Path

import pytest

from treemail.consumers.app import Worker
from treemail.host import Treemail

from .conftest import WORKER_ENV, Calls, make_config, messaging_env, wait_for_workers

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
# Written by `make prometheus` when it could not install the package.
SKIP_REASON_FILE = ROOT / ".venv" / "prometheus-unavailable"


def binary(name: str) -> str:
    found = shutil.which(name) or (f"/usr/bin/{name}" if os.access(f"/usr/bin/{name}", os.X_OK) else None)
    if found is None:
        why = SKIP_REASON_FILE.read_text().strip() if SKIP_REASON_FILE.exists() else (
            "install Debian's prometheus package (`make prometheus` as root)"
        )
        pytest.skip(f"{name} not found: {why}")
    return found


def promtool(*args: str, stdin: str | None = None) -> str:
    done = subprocess.run([binary("promtool"), *args], input=stdin, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, f"promtool {' '.join(args)} failed:\n{done.stdout}\n{done.stderr}"
    return done.stdout


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def http_get(url: str) -> bytes:
    with urllib.request.urlopen(url, timeout=5) as response:
        return response.read()


def dashboard_queries() -> list[str]:
    dashboard = json.loads((DEPLOY / "grafana" / "treemail-dashboard.json").read_text())
    return [target["expr"] for panel in dashboard["panels"] for target in panel["targets"]]


def test_deploy_config_and_rules_pass_promtool():
    promtool("check", "config", str(DEPLOY / "prometheus.yml"))
    promtool("check", "rules", str(DEPLOY / "alerts.yml"))
    out = promtool("test", "rules", str(DEPLOY / "alerts_test.yml"))
    assert "SUCCESS" in out


async def test_worker_metrics_pass_promtool_lint(redis_url):
    """The exposition a worker serves, with labelled series in it, lints clean."""
    config = make_config(redis_url, max_pending_per_session=1)
    worker = Worker(config, redis_url, consumer="lint", metrics_port=0)
    await worker.start()
    host = await Treemail.connect(config, redis_url)
    try:
        calls = Calls()
        root = await host.register_root("planner", "x", rules={"child": "allow"})
        child = await host.register_child(root.session_id, "explore", "a", rules={"parent": "allow"})
        await host.start_run(root.session_id, "run-1")
        for body in ("one", "two"):
            await host.send_message(calls.ctx(root.session_id), {"to": child.handle, "body": body})
        await worker.refresh_stats()
        body = (await asyncio.to_thread(http_get, f"http://127.0.0.1:{worker.metrics_port}/metrics")).decode()
    finally:
        await host.close()
        await worker.stop()
    assert 'treemail_sends_total{outcome="send_message:inbox_full"}' in body
    assert "treemail_command_backlog{" in body
    promtool("check", "metrics", stdin=body)


@contextlib.contextmanager
def prometheus_server(tmp_path: Path, worker_port: int):
    """A Prometheus scraping one worker every second, with deploy/alerts.yml loaded; killed on exit."""
    port = free_port()
    config = {
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
        "rule_files": [str(DEPLOY / "alerts.yml")],
        "scrape_configs": [
            {"job_name": "treemail-workers", "static_configs": [{"targets": [f"127.0.0.1:{worker_port}"]}]}
        ],
    }
    config_file = tmp_path / "prometheus.yml"
    config_file.write_text(json.dumps(config))  # YAML is a superset of JSON
    log = open(tmp_path / "prometheus.log", "w")
    process = subprocess.Popen(
        [
            binary("prometheus"), f"--config.file={config_file}", f"--storage.tsdb.path={tmp_path / 'data'}",
            f"--web.listen-address=127.0.0.1:{port}",
        ],
        stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
    )
    try:
        base = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 30
        while True:
            assert process.poll() is None, (tmp_path / "prometheus.log").read_text()
            with contextlib.suppress(OSError):
                http_get(f"{base}/-/ready")
                break
            assert time.monotonic() < deadline, "prometheus not ready:\n" + (tmp_path / "prometheus.log").read_text()
            time.sleep(0.1)
        yield base
    finally:
        process.kill()
        process.wait()
        log.close()


def query(base: str, promql: str) -> list[dict]:
    answer = json.loads(http_get(f"{base}/api/v1/query?" + urllib.parse.urlencode({"query": promql})))
    assert answer["status"] == "success", answer
    return answer["data"]["result"]


@contextlib.contextmanager
def worker_process(url: str, metrics_port: int, **messaging):
    env = {**os.environ, "REDIS_URL": url, **WORKER_ENV, **messaging_env(**messaging)}
    process = subprocess.Popen(
        [sys.executable, "-m", "treemail", "worker", "--metrics-port", str(metrics_port)],
        env=env, start_new_session=True,
    )
    try:
        yield process
    finally:
        process.terminate()
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


async def test_prometheus_scrapes_worker_sends_by_outcome(redis_url, tmp_path):
    binary("prometheus")
    worker_port = free_port()
    calls = Calls()
    with worker_process(redis_url, worker_port, max_pending_per_session=2) as worker, \
            prometheus_server(tmp_path, worker_port) as base:
        await wait_for_workers(redis_url, 1)
        host = await Treemail.connect(make_config(redis_url, max_pending_per_session=2), redis_url)
        try:
            root = await host.register_root("planner", "plans", rules={"child": "allow"})
            child = await host.register_child(root.session_id, "explore", "reads", rules={"parent": "allow"})
            await host.start_run(root.session_id, "run-1")
            for i in range(3):
                await host.send_message(calls.ctx(root.session_id), {"to": child.handle, "body": f"m{i}"})
        finally:
            await host.close()
        assert worker.poll() is None

        expected = {"ok": 2.0, "send_message:inbox_full": 1.0}
        deadline = time.monotonic() + 20
        while True:
            series = await asyncio.to_thread(query, base, "treemail_sends_total")
            # Every known outcome is a series from the start (0 until it happens): dashboards show 0.
            seen = {s["metric"]["outcome"]: float(s["value"][1]) for s in series}
            if {o: v for o, v in seen.items() if v} == expected and "send_message:max_hops_exceeded" in seen:
                break
            assert time.monotonic() < deadline, f"prometheus has {series}, expected {expected}"
            await asyncio.sleep(0.25)
        [sample] = [s for s in series if s["metric"]["outcome"] == "ok"]
        assert sample["metric"]["job"] == "treemail-workers"
        assert sample["metric"]["instance"] == f"127.0.0.1:{worker_port}"

        [up] = await asyncio.to_thread(query, base, 'up{job="treemail-workers"}')
        assert up["value"][1] == "1"
        # The stats task ran in the real process: both command streams report, drained.
        backlog = await asyncio.to_thread(query, base, "treemail_command_backlog")
        assert sorted(s["metric"]["stream"] for s in backlog) == ["tm:cmd:{c0}", "tm:cmd:{c1}"]
        # Every dashboard query is valid PromQL, and deploy/alerts.yml loaded and evaluates cleanly.
        for promql in dashboard_queries():
            await asyncio.to_thread(query, base, promql.replace("$__rate_interval", "1m"))
        rules = json.loads(await asyncio.to_thread(http_get, f"{base}/api/v1/rules"))
        loaded = [rule for group in rules["data"]["groups"] for rule in group["rules"]]
        assert len(loaded) == len(re.findall(r"^\s*- alert:", (DEPLOY / "alerts.yml").read_text(), re.M))
        assert {rule["health"] for rule in loaded} <= {"ok", "unknown"}, loaded
