"""Commands that can never be decided are set aside with a reason, visible in metrics and the CLI."""

import asyncio
import os
import subprocess
import sys

import redis.asyncio as aioredis

from treemail.consumers.app import Worker
from treemail.adapters.codec import encode_command
from treemail.adapters import keys, metrics
from treemail.host import SendContext, Treemail
from treemail.domain.commands import SendArguments, SendMessage

from .conftest import Calls, make_config


async def dead_letters(redis):
    return [{k.decode(): v.decode() for k, v in f.items()} for _, f in await redis.xrange(keys.dead_letters())]


async def wait_for(predicate, timeout=15.0):
    for _ in range(int(timeout / 0.05)):
        if await predicate():
            return True
        await asyncio.sleep(0.05)
    return False


async def test_malformed_and_poison_commands_go_to_the_dead_letter_stream(redis_url):
    config = make_config(redis_url)
    config = config.model_copy(update={"service": config.service.model_copy(update={"max_deliveries": 2})})
    worker = Worker(config, redis_url, consumer="dl-worker")
    await worker.start()
    host = await Treemail.connect(config, redis_url)
    raw = aioredis.Redis.from_url(redis_url)
    before = {r: metrics.DEAD_LETTERS.labels(r)._value.get() for r in ("malformed", "max_deliveries")}
    try:
        root = await host.register_root("planner", "x", rules={"child": "allow"})
        child = await host.register_child(root.session_id, "explore", "x")
        await host.start_run(root.session_id, "run-1")
        # Malformed: not a command at all.
        await raw.xadd(keys.command_stream(0), {"__data__": b"{not json"})
        # Poison: a sender whose directory entry is corrupt makes every decision of it fail.
        await raw.set(keys.directory("01a228af-dead-7000-8000-000000000000"), b"corrupt")
        poison = SendMessage("cmd-poison", SendContext("01a228af-dead-7000-8000-000000000000", "r", "c"),
                             SendArguments(child.handle, "x"), "dead-letter-probe")
        await raw.xadd(keys.command_stream(0), {"__data__": encode_command(poison)})
        # A good send still goes through meanwhile.
        result = await host.send_message(Calls().ctx(root.session_id), {"to": child.handle, "body": "fine"})
        assert "message_id" in result
        assert await wait_for(lambda: _reasons(raw, {"malformed", "max_deliveries"}))
        letters = await dead_letters(raw)
        assert {d["reason"] for d in letters} == {"malformed", "max_deliveries"}
        assert any(d["data"] == "{not json" for d in letters)
        assert metrics.DEAD_LETTERS.labels("malformed")._value.get() == before["malformed"] + 1
        assert metrics.DEAD_LETTERS.labels("max_deliveries")._value.get() == before["max_deliveries"] + 1
        # Nothing is left pending: both were acknowledged when set aside.
        pending = await raw.xpending(keys.command_stream(0), keys.COMMAND_GROUP)
        assert pending["pending"] == 0
        env = {**os.environ, "REDIS_URL": redis_url}
        listing = subprocess.run([sys.executable, "-m", "treemail", "dead-letters"], env=env,
                                 capture_output=True, text=True, timeout=60)
        assert listing.returncode == 0
        assert "malformed" in listing.stdout and "max_deliveries" in listing.stdout
    finally:
        await raw.aclose()
        await host.close()
        await worker.stop()


async def _reasons(raw, wanted):
    return {d["reason"] for d in await dead_letters(raw)} >= wanted
