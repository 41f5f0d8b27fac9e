"""Access to the server: passwords never printed, and an ACL user limited to treemail's keys runs everything."""

import asyncio
import os
import subprocess
import sys
import tempfile
import time
from urllib.parse import urlsplit

import pytest
import redis.asyncio as aioredis

from treemail.adapters.config import ServiceConfig
from treemail.adapters.connection import connect, redact, require_durable_server
from treemail.adapters.embedded import free_port
from treemail.domain.errors import RedisUnavailable
from treemail.host import Treemail

from ..conftest import CLUSTER
from .conftest import WORKER_ENV, live, make_config, wait_for_workers

SECRET = "hunter2-very-secret"


@pytest.mark.parametrize("url", [
    f"redis://:{SECRET}@127.0.0.1:{{port}}/0",
    f"redis://treemail:{SECRET}@127.0.0.1:{{port}}/0",
    f"redis://127.0.0.1:{{port}}/0?password={SECRET}",
])
async def test_no_password_appears_in_a_cannot_reach_error(url):
    url = url.format(port=free_port())  # nothing listens there
    with pytest.raises(RedisUnavailable) as unreachable:
        await connect(url, ServiceConfig(connect_attempts=1))
    message = str(unreachable.value)
    assert message.startswith("cannot reach Redis/Valkey at redis://")
    assert SECRET not in message and "***" in message


def test_redact_hides_only_the_password():
    assert redact(f"rediss://app:{SECRET}@cache:6380/2?ssl_cert_reqs=none") == (
        "rediss://app:***@cache:6380/2?ssl_cert_reqs=none")
    assert redact("redis://127.0.0.1:6379/0") == "redis://127.0.0.1:6379/0"
    assert redact("unix:///run/valkey.sock?db=1&password=x") == "unix:///run/valkey.sock?db=1&password=***"


@pytest.mark.skipif(CLUSTER, reason="ACL users are per node; the single-server case shows the rule")
async def test_an_acl_user_limited_to_treemail_keys_runs_the_durable_stack_without_config_rights(redis_url, calls):
    """The ACL docs/operations.md gives: `~tm:* +@all -@dangerous` (no CONFIG, no INFO, no other keys)."""
    admin = aioredis.Redis.from_url(redis_url)
    await admin.execute_command("ACL", "SETUSER", "treemail-test", "reset", "on", f">{SECRET}", "~tm:*",
                                "+@all", "-@dangerous")
    parts = urlsplit(redis_url)
    url = f"redis://treemail-test:{SECRET}@{parts.hostname}:{parts.port}/0"
    log = tempfile.NamedTemporaryFile(prefix="treemail-acl-worker-", suffix=".log", delete=False)
    env = {**os.environ, "REDIS_URL": url, **WORKER_ENV, "TREEMAIL_SERVICE_PROFILE": "durable",
           "TREEMAIL_LOG": "INFO"}
    worker = subprocess.Popen([sys.executable, "-m", "treemail", "worker"], env=env, stdout=log, stderr=log,
                              start_new_session=True)
    config = make_config(url, profile="durable")
    try:
        limited = await connect(url, config.service)
        with pytest.raises(Exception, match="permission"):
            await limited.get("not-treemail")  # the user really is limited
        await require_durable_server(limited)  # WAITAOF, not CONFIG GET
        await limited.aclose()
        await wait_for_workers(redis_url, 1)
        host = await Treemail.connect(config, url)
        try:
            root = await host.register_root("planner", "x", rules={"child": "allow"})
            child = await host.register_child(root.session_id, "explore", "x")
            await live(host, root)  # only a session's open run may send (exact live sender)
            result = await host.send_message(calls.ctx(root.session_id), {"to": child.handle, "body": "hi"})
            assert "message_id" in result, result
        finally:
            await host.close()
        deadline = time.monotonic() + 10
        while "deciding commands on" not in open(log.name).read() and time.monotonic() < deadline:
            await asyncio.sleep(0.1)
    finally:
        worker.terminate()
        worker.wait(30)
        await admin.execute_command("ACL", "DELUSER", "treemail-test")
        await admin.aclose()
    output = open(log.name).read()
    os.unlink(log.name)
    assert worker.returncode == 0, output
    assert "deciding commands on redis://treemail-test:***@" in output
    assert SECRET not in output
