"""The raw send round trip: what a send costs the host with nothing but XADD and a blocking reply wait.

Shaped like treemail's producer (treemail/adapters/commandclient.py), without its batching: one client owns one
reply list; a send XADDs a command-sized entry (the same compact JSON
`encode_command` writes) to a stream and awaits a future; one listener task
BLMPOPs the reply list (up to 1000 answers a round trip: answers come in bursts) and
hands each answer to its future by command id. The echo consumer is a
subprocess, as the treemail worker is, so its CPU is not the host's: it reads
the stream with XREADGROUP (COUNT 100, BLOCK 100, as the worker's subscriber),
answers every command of a batch with one pipelined LPUSH + EXPIRE per reply
list, and XACKs the batch. It decides nothing.

    python -m bench.roundtrip URL    # the echo consumer (started by `start_echo`)
"""

import asyncio
import contextlib
import json
import subprocess
import sys
import time
import uuid
from pathlib import Path

import redis.asyncio as aioredis
from redis.exceptions import ResponseError

from treemail.domain.protocol import PROTOCOL_VERSION

STREAM = "raw:rt:cmd"
GROUP = "raw-rt"
ROOT = Path(__file__).resolve().parent.parent


def reply_list(client_id: str) -> str:
    return f"raw:rt:reply:{client_id}"


class RawClient:
    """XADD + a future per send; one BLPOP listener per client, as `CommandClient`."""

    def __init__(self, url: str) -> None:
        # The plain shape: every send its own XADD, at most 32 in flight (treemail's client publishes the
        # sends of one turn of the event loop in one pipeline instead).
        pool = aioredis.BlockingConnectionPool.from_url(url, max_connections=64, timeout=None)
        self.redis = aioredis.Redis(connection_pool=pool)
        self.publishing = asyncio.Semaphore(32)
        self.listener = aioredis.Redis.from_url(url)
        self.client_id = str(uuid.uuid4())
        self.waiting: dict[str, asyncio.Future] = {}
        self.closing = False
        self.task = asyncio.create_task(self._listen())

    async def request(self, sender: str, run_id: str, call: str, to: str, body: str) -> dict:
        command_id = str(uuid.uuid4())
        data = {"v": PROTOCOL_VERSION, "id": command_id, "ctx": [sender, run_id, call],
                "args": [to, body, "steer"], "reply_to": self.client_id}
        future = asyncio.get_running_loop().create_future()
        self.waiting[command_id] = future
        try:
            async with self.publishing:
                await self.redis.xadd(STREAM, {"__data__": json.dumps(data, separators=(",", ":"))})
            return await future
        finally:
            self.waiting.pop(command_id, None)

    async def _listen(self) -> None:
        key = reply_list(self.client_id)
        while not self.closing:
            popped = await self.listener.blmpop(1, 1, key, direction="LEFT", count=1000)
            for raw in popped[1] if popped else ():
                answer = json.loads(raw)
                future = self.waiting.get(answer.pop("command_id"))
                if future is not None and not future.done():
                    future.set_result(answer)

    async def close(self) -> None:
        # As `CommandClient.close`: a cancel may not end a BLMPOP in flight, the flag ends the loop within 1 s.
        self.closing = True
        self.task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self.task
        await self.listener.aclose()
        await self.redis.aclose()


async def prepare(url: str) -> None:
    r = aioredis.Redis.from_url(url)
    try:
        await r.delete(STREAM)
        await r.xgroup_create(STREAM, GROUP, id="$", mkstream=True)
    except ResponseError as exc:
        if "BUSYGROUP" not in str(exc):
            raise
    finally:
        await r.aclose()


def start_echo(url: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "bench.roundtrip", url], cwd=ROOT, start_new_session=True)


async def echo(url: str) -> None:
    r = aioredis.Redis.from_url(url)
    while True:
        reply = await r.xreadgroup(GROUP, "echo-1", {STREAM: ">"}, count=100, block=100)
        if not reply:
            continue
        entries = reply[0][1]
        answers: dict[str, list[str]] = {}
        for _, fields in entries:
            command = json.loads(fields[b"__data__"])
            ok = {"message_id": str(uuid.uuid4()), "mode": command["args"][2], "recipient_state": "running"}
            answers.setdefault(command["reply_to"], []).append(json.dumps({"command_id": command["id"], "ok": ok}))
        async with r.pipeline(transaction=False) as pipe:
            for reply_to, values in answers.items():
                pipe.lpush(reply_list(reply_to), *values)
                pipe.expire(reply_list(reply_to), 120)
            pipe.xack(STREAM, GROUP, *[entry_id for entry_id, _ in entries])
            await pipe.execute()


def count_calls(client, name: str) -> list[int]:
    """Wrap `client.<name>` (an instance attribute shadows the method); the list's one item counts the calls.

    Counts the reply listener's pops: answers per wake-up is how far the consumer batched its replies.
    """
    calls = [0]
    method = getattr(client, name)

    async def counted(*args, **kwargs):
        calls[0] += 1
        return await method(*args, **kwargs)

    setattr(client, name, counted)
    return calls


async def paced(rate: int, total: int, send) -> dict:
    """`total` calls of `send(i)` at `rate` per second, each its own task; latencies of those that returned ok.

    `send(i)` returns a result dict (ok when it has "message_id"). Host CPU is this process's
    CPU over the span, whatever else in it runs (the client's listener included).
    """
    latencies: list[float] = []
    lateness: list[float] = []
    failures: list[dict] = []

    async def one(i: int, scheduled: float) -> None:
        start = time.perf_counter()
        lateness.append(start - scheduled)
        result = await send(i)
        if "message_id" in result:
            latencies.append(time.perf_counter() - start)
        else:
            failures.append(result)

    # Only the calls still running are held: a list of every finished task grows the load generator's
    # heap by one tracked object per send, and its full garbage collections (50 ms and more on this
    # machine) then stall every call in flight and set the tail it measures.
    running: set[asyncio.Task] = set()
    host_cpu = time.process_time()
    t0 = time.perf_counter() + 0.05
    for i in range(total):
        scheduled = t0 + i / rate
        delay = scheduled - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        task = asyncio.create_task(one(i, scheduled))
        running.add(task)
        task.add_done_callback(running.discard)
    await asyncio.gather(*running)
    return {"latencies": latencies, "lateness": lateness, "failures": failures,
            "elapsed": time.perf_counter() - t0, "host_cpu": time.process_time() - host_cpu}


if __name__ == "__main__":
    asyncio.run(echo(sys.argv[1]))
