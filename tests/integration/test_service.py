"""Profiles, connection failures and configuration at the process edge."""

import subprocess
import sys

import pytest

from treemail.consumers.app import Worker
from treemail.adapters.config import Config, ServiceConfig
from treemail.adapters.connection import connect
from treemail.adapters.embedded import LocalValkey, free_port
from treemail.domain.errors import RedisUnavailable
from treemail.host import Treemail

from .conftest import Calls, make_config


async def test_durable_profile_waits_for_fsync_and_succeeds(redis_url):
    config = make_config(redis_url, profile="durable")
    worker = Worker(config, redis_url, consumer="durable-worker")
    await worker.start()
    host = await Treemail.connect(config, redis_url)
    try:
        root = await host.register_root("planner", "x", rules={"child": "allow"})
        child = await host.register_child(root.session_id, "explore", "x")
        await host.start_run(root.session_id, "run-1")
        result = await host.send_message(Calls().ctx(root.session_id), {"to": child.handle, "body": "fsynced"})
        assert "message_id" in result
    finally:
        await host.close()
        await worker.stop()


async def test_durable_profile_refuses_a_server_without_aof():
    server = LocalValkey(durable=False).start()
    try:
        config = Config(service=ServiceConfig(redis_url=server.url, profile="durable"))
        worker = Worker(config, server.url, consumer="refused")
        with pytest.raises(RedisUnavailable, match="appendonly"):
            await worker.start()
        await worker.redis.aclose()
    finally:
        server.cleanup()


async def test_unreachable_server_is_a_clear_error_after_bounded_retries():
    url = f"redis://127.0.0.1:{free_port()}/0"
    with pytest.raises(RedisUnavailable, match="after 2 attempts"):
        await connect(url, ServiceConfig(connect_attempts=2))


def test_worker_cli_reports_unreachable_server_without_traceback():
    url = f"redis://127.0.0.1:{free_port()}/0"
    env = {"REDIS_URL": url, "TREEMAIL_SERVICE_CONNECT_ATTEMPTS": "2", "PATH": ""}
    done = subprocess.run([sys.executable, "-m", "treemail", "worker"], env=env, capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 2
    assert "cannot reach Redis/Valkey" in done.stderr
    assert "Traceback" not in done.stderr
    # The advice is one a worker can follow: only `demo` starts a Valkey of its own, so no "unset REDIS_URL".
    assert "unset REDIS_URL" not in done.stderr and "`treemail server`" in done.stderr, done.stderr
    assert ".." not in done.stderr.replace("...", ""), done.stderr


def test_cli_rejects_unknown_config_key(tmp_path):
    path = tmp_path / "treemail.toml"
    path.write_text("[messaging]\nmax_hop = 3\n")
    done = subprocess.run([sys.executable, "-m", "treemail", "--config", str(path), "worker"],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    assert "unknown key `messaging.max_hop`" in done.stderr


async def test_send_while_server_is_down_answers_engine_shutdown():
    server = LocalValkey(durable=False).start()
    config = make_config(server.url)
    worker = Worker(config, server.url, consumer="w")
    await worker.start()
    host = await Treemail.connect(config, server.url)
    try:
        root = await host.register_root("planner", "x", rules={"child": "allow"})
        child = await host.register_child(root.session_id, "explore", "x")
        await host.start_run(root.session_id, "run-1")
        await worker.stop()
        server.stop()
        result = await host.send_message(Calls().ctx(root.session_id), {"to": child.handle, "body": "x"})
        assert result["error"]["code"] == "send_message:engine_shutdown"
    finally:
        await host.close()
        server.cleanup()
