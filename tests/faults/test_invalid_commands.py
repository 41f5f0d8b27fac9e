"""Scale-out and faults: commands no worker can decide, mixed into a batch of good ones.

A producer of another version, or anything else with server access, can write
entries that parse as JSON but are no command (``to=123``, ``mode="bogus"``),
or commands whose decision fails (a corrupt directory entry). None of them may
hold back the good commands of its batch until the reclaim pass.
"""

import asyncio
import json
import time

import pytest
import redis.asyncio as aioredis

from treemail.adapters import keys, metrics
from treemail.adapters.codec import encode_command
from treemail.consumers.app import Worker
from treemail.domain import ids
from treemail.domain.commands import SendArguments, SendContext, SendMessage
from treemail.host import Treemail

from .helpers import config_for

REPLY_TO = "faults-invalid-commands"
RECLAIM_MS = 60_000  # far beyond the test: only the live batch can answer in time


def good(sender: str, to: str, n: int) -> tuple[str, str]:
    command = SendMessage(f"good-{n}", SendContext(sender, "run-1", f"call-{n}"), SendArguments(to, f"#{n}"),
                          REPLY_TO)
    return command.command_id, encode_command(command)


def bad(n: int, **changes) -> tuple[str, str]:
    entry = {"id": f"bad-{n}", "ctx": ["s", "run-1", f"bad-call-{n}"], "args": ["x", "body", "steer"],
             "reply_to": REPLY_TO}
    for name, value in changes.items():
        if name in ("to", "body", "mode"):
            entry["args"][("to", "body", "mode").index(name)] = value
        else:
            entry[name] = value
    return entry["id"], json.dumps(entry)


async def answers(raw, count: int, within: float) -> dict[str, dict]:
    out, deadline = {}, time.monotonic() + within
    while len(out) < count and time.monotonic() < deadline:
        popped = await raw.blpop([keys.reply_list(REPLY_TO)], timeout=0.2)
        if popped:
            answer = json.loads(popped[1])
            out[answer.pop("command_id")] = answer
    return out


async def batches_observed() -> tuple[float, float]:
    samples = {s.name: s.value for m in metrics.BATCH_SIZE.collect() for s in m.samples}
    return samples["treemail_batch_size_count"], samples["treemail_batch_size_sum"]


@pytest.mark.slow
@pytest.mark.expected_duration_s(10)
async def test_invalid_commands_in_a_batch_are_dead_lettered_at_once_and_the_rest_decided_in_that_batch(
    redis_url,
):
    config = config_for(redis_url, max_pending_per_session=1000, max_inflight_per_pair=0)
    config = config.model_copy(update={"service": config.service.model_copy(update={
        "reclaim_idle_ms": RECLAIM_MS, "command_streams": 1, "batch_size": 100})})
    host = await Treemail.connect(config, redis_url)
    raw = aioredis.Redis.from_url(redis_url)
    worker = Worker(config, redis_url, consumer="mixed-batch")
    try:
        root = await host.register_root("planner", "x", rules={"child": "allow"})
        child = await host.register_child(root.session_id, "explore", "x")
        await host.start_run(root.session_id, "run-1")  # only a session's open run may send (exact live sender)
        entries = [good(root.session_id, child.handle, n) for n in range(50)]
        invalid = [bad(0, to=123), bad(1, mode="bogus"), bad(2, body=None), bad(3, ctx=["only", "two"]),
                   bad(4, to="\ud800")]
        for n, entry in enumerate(invalid):  # spread through the batch
            entries.insert(n * 11 + 3, entry)
        stream = keys.command_stream(0)
        for _, data in entries:
            await raw.xadd(stream, {"__data__": data})
        await raw.xadd(stream, {"__data__": b"\x00 not even json"})
        count_before, sum_before = await batches_observed()

        started = time.monotonic()
        await worker.start()  # the whole backlog is one XREADGROUP batch
        got = await answers(raw, len(entries), within=10)
        elapsed = time.monotonic() - started
        assert set(got) == {command_id for command_id, _ in entries}, f"missing: {len(entries) - len(got)}"
        assert all("ok" in got[f"good-{n}"] for n in range(50)), got
        for command_id, _ in invalid:
            assert got[command_id]["error"]["code"] == "send_message:invalid_arguments", got[command_id]
        assert "`to` must be a string, not int" in got["bad-0"]["error"]["message"]
        # The valid commands were decided in the batch they came in, not in a later one or by reclaim.
        count_after, sum_after = await batches_observed()
        assert (count_after - count_before, sum_after - sum_before) == (1, 50)
        assert elapsed < RECLAIM_MS / 1000
        letters = [{k.decode(): v.decode(errors="replace") for k, v in f.items()}
                   for _, f in await raw.xrange(keys.dead_letters())]
        assert sorted(d["reason"] for d in letters) == ["invalid"] * 5 + ["malformed"]
        details = {d["detail"] for d in letters}
        assert {"`to` must be a string, not int", "`mode` must be \"steer\" or \"queue\"",
                "`body` must be a string, not NoneType"} <= details
        assert (await raw.xpending(stream, keys.COMMAND_GROUP))["pending"] == 0
        assert len(await host.obligations.pending_mail(child.session_id)) == 50
        print(f"\n50 valid and 6 invalid commands in one batch: every one answered in {elapsed:.2f} s")
    finally:
        await worker.stop()
        await host.close()
        await raw.aclose()


@pytest.mark.slow
@pytest.mark.expected_duration_s(10)
async def test_a_command_whose_decision_fails_does_not_hold_back_its_batch(redis_url):
    config = config_for(redis_url, max_pending_per_session=1000, max_inflight_per_pair=0)
    config = config.model_copy(update={"service": config.service.model_copy(update={
        "reclaim_idle_ms": RECLAIM_MS, "command_streams": 1})})
    host = await Treemail.connect(config, redis_url)
    raw = aioredis.Redis.from_url(redis_url)
    worker = Worker(config, redis_url, consumer="poisoned-batch")
    try:
        root = await host.register_root("planner", "x", rules={"child": "allow"})
        child = await host.register_child(root.session_id, "explore", "x")
        await host.start_run(root.session_id, "run-1")  # only a session's open run may send (exact live sender)
        corrupt = ids.uuid7()
        await raw.set(keys.directory(corrupt), b"corrupt")  # every decision of this sender fails
        entries = [good(root.session_id, child.handle, n) for n in range(20)]
        entries.insert(7, good(corrupt, child.handle, 99))
        for _, data in entries:
            await raw.xadd(keys.command_stream(0), {"__data__": data})
        await worker.start()
        got = await answers(raw, 20, within=10)
        assert {f"good-{n}" for n in range(20)} <= set(got)
        assert all("ok" in got[f"good-{n}"] for n in range(20))
        # The failing one stays pending for reclaim (and, past max_deliveries, the dead letters).
        for _ in range(50):  # a batch is acknowledged just after its answers are pushed
            pending = await raw.xpending_range(keys.command_stream(0), keys.COMMAND_GROUP, "-", "+", 10)
            if len(pending) <= 1:
                break
            await asyncio.sleep(0.05)
        assert len(pending) == 1
    finally:
        await worker.stop()
        await host.close()
        await raw.aclose()
