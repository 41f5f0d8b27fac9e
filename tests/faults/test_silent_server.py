"""A server that stops answering (paused, partitioned) without closing the connection.

The worker's connection has no timer per reply (it cost a tenth of
the worker's CPU); each batch is bounded as a whole instead. A silent server
must fail the batch within that bound, as a lost connection would, and the
same commands must be decided once the server answers again.
"""

import json
import time

import pytest
import redis.asyncio as aioredis
from redis.exceptions import TimeoutError as RedisTimeoutError

from tests.integration.conftest import make_config
from treemail.adapters import keys
from treemail.consumers.app import Worker
from treemail.domain.commands import SendArguments, SendContext, SendMessage

pytestmark = [pytest.mark.slow, pytest.mark.expected_duration_s(9)]


async def test_a_silent_server_fails_the_batch_within_its_deadline_and_it_is_decided_when_the_server_answers(
    redis_url,
):
    worker = Worker(make_config(redis_url), redis_url, consumer="silent-test")
    await worker.start()
    admin = aioredis.Redis.from_url(redis_url)
    command = SendMessage("cmd-1", SendContext("no-such-sender", "run-1", "call-1"), SendArguments("someone", "hi"),
                          "client-1")
    try:
        pause_s = worker.step_deadline_s + 3
        await admin.execute_command("CLIENT", "PAUSE", int(pause_s * 1000), "ALL")
        started = time.monotonic()
        with pytest.raises(RedisTimeoutError):
            await worker.decide_commands([command])
        waited = time.monotonic() - started
        assert worker.step_deadline_s - 0.5 <= waited < pause_s  # bounded, and not given up early

        await admin.execute_command("CLIENT", "UNPAUSE")
        await worker.decide_commands([command])

        answer = json.loads(await admin.rpop(keys.reply_list("client-1")))
        assert answer["command_id"] == "cmd-1" and answer["error"]["code"] == "send_message:unknown_session"
    finally:
        await admin.execute_command("CLIENT", "UNPAUSE")
        await admin.aclose()
        await worker.stop()
