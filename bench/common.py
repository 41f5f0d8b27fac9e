"""Shared helpers: the machine, worker subprocesses, prefills, percentiles.

Slightly over the house's 200 lines: each helper is small and every phase uses several.
"""

import asyncio
import contextlib
import json
import os
import platform
import random
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import redis.asyncio as aioredis
from redis.exceptions import ResponseError

from treemail.adapters.codec import encode_command
from treemail.adapters import keys, members
from treemail.adapters.config import Config, MessagingConfig, ServiceConfig
from treemail.adapters.connection import connect
from treemail.adapters.eventstore import EventStore
from treemail.domain.commands import SendArguments, SendContext, SendMessage
from treemail.services.sessions import SessionService

REPLY_TO = "bench-dummy-client"
STREAM = keys.command_stream(0)
# Nobody consumes in a backlog phase, so a sender's unsettled count only grows: each phase spreads its
# sends round-robin over enough senders that none reaches this (the highest the config allows).
MAX_OUTSTANDING = 1000


async def flush(url: str) -> None:
    """``flush_sync`` on a connection of its own (one server)."""
    r = aioredis.Redis.from_url(url)
    await flush_sync(r)
    await r.aclose()


async def flush_sync(r, **target) -> None:
    """Empty the server, and return only once its memory is released.

    Valkey frees a plain FLUSHALL's keys in a background thread (``lazyfree-lazy-user-flush``, on by
    default since Valkey 8): after the 1,000,000 sends of phase 3d that thread kept a core busy well
    into the next phases, and the latency phase run just after it measured a p50 of 182 ms. Each phase
    starts on a quiet server instead. ``target``: ``target_nodes`` on a cluster.
    """
    await r.execute_command("FLUSHALL", "SYNC", **target)


def bench_config(url: str) -> Config:
    """Inbox never fills, no pair window, the highest per-sender capacity, one command stream."""
    return Config(
        messaging=MessagingConfig(max_pending_per_session=1_000_000_000, max_inflight_per_pair=0,
                                  max_outstanding_per_source=MAX_OUTSTANDING),
        service=ServiceConfig(redis_url=url, command_streams=1),
    )


def worker_env(url: str, extra: dict[str, str] | None = None) -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        REDIS_URL=url,
        TREEMAIL_SERVICE_COMMAND_STREAMS="1",
        TREEMAIL_MESSAGING_MAX_PENDING_PER_SESSION="1000000000",
        TREEMAIL_MESSAGING_MAX_INFLIGHT_PER_PAIR="0",
        TREEMAIL_MESSAGING_MAX_OUTSTANDING_PER_SOURCE=str(MAX_OUTSTANDING),
        TREEMAIL_LOG="WARNING",
    )
    env.update(extra or {})
    return env


class Workers:
    """`treemail worker` subprocesses; always killed, even on errors."""

    def __init__(self, url: str, extra_env: dict[str, str] | None = None) -> None:
        self.url = url
        self.extra_env = extra_env
        self.procs: list[subprocess.Popen] = []
        self.logs: list[Path] = []

    def start(self, count: int) -> None:
        exe = str(Path(sys.executable).parent / "treemail")
        for _ in range(count):
            log = Path(tempfile.mkstemp(prefix="bench-worker-", suffix=".log")[1])
            self.logs.append(log)
            with open(log, "wb") as out:
                self.procs.append(
                    subprocess.Popen([exe, "worker"], env=worker_env(self.url, self.extra_env), stdout=out, stderr=subprocess.STDOUT,
                                     start_new_session=True)
                )

    def check_alive(self) -> None:
        for proc, log in zip(self.procs, self.logs):
            if proc.poll() is not None:
                raise RuntimeError(f"worker {proc.pid} exited with {proc.returncode}: {log.read_text()[-2000:]}")

    def stop(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in self.procs:
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        for log in self.logs:
            log.unlink(missing_ok=True)
        self.procs.clear()
        self.logs.clear()


async def register_trees(host, trees: int, children: int, run_on: str = "root") -> list[tuple[str, list[str]]]:
    """`trees` roots, each with `children` children; returns (root id, [child ids]).

    Only a session's open run may send (exact live sender): `run_on` says who sends, "root" or "children".
    """
    out = []
    for t in range(trees):
        root = await host.register_root("planner", f"root {t}", rules={"child": "allow", "parent": "allow"},
                                        status="running")
        kids = await asyncio.gather(*[
            host.register_child(root.session_id, "worker", f"child {t}.{c}", rules={"parent": "allow"},
                                status="running")
            for c in range(children)
        ])
        if run_on == "root":
            await host.start_run(root.session_id, "run-1")
        else:
            await asyncio.gather(*[host.start_run(k.session_id, "run-1") for k in kids])
        out.append((root.session_id, [k.session_id for k in kids]))
    return out


def stream_of(route: str, streams: int) -> str:
    """The command stream of the tree whose root is ``route`` (treemail/adapters/commandclient.py routes the same way)."""
    return keys.command_stream(keys.command_shard(route, streams))


async def prefill_commands(redis, trees: list[tuple[str, list[str]]], total: int, streams: int = 1,
                           seed: int = 42, both_ways: bool = False, by_sender: bool = False) -> dict[str, int]:
    """`total` SendMessage commands (root i % trees -> random child of its tree), each on its tree's stream.

    ``both_ways``: every other round of the trees a random child sends to its root instead (children report
    to their parents). ``by_sender``: each command on its sender's stream, as releases before tree routing
    put them. Senders take turns so that each has at most ceil(total / trees) unsettled messages (source
    capacity).

    The consumer groups are created at id 0 first: FastStream creates them at `$`
    when they do not exist, which would skip everything written before.
    Returns how many commands went to each stream.
    """
    names = [keys.command_stream(i) for i in range(streams)]
    for name in names:
        try:  # the host may already have created it (EventStore.ensure_command_group)
            await redis.xgroup_create(name, keys.COMMAND_GROUP, id="0", mkstream=True)
        except ResponseError as exc:
            if "BUSYGROUP" not in str(exc):
                raise
    if -(-total // len(trees)) >= MAX_OUTSTANDING:
        raise ValueError(f"{total} sends from {len(trees)} senders exceed the per-source capacity {MAX_OUTSTANDING}")
    rng = random.Random(seed)
    per_stream = {name: 0 for name in names}
    chunk = 5000
    for start in range(0, total, chunk):
        async with redis.pipeline(transaction=False) as pipe:
            for i in range(start, min(total, start + chunk)):
                root, kids = trees[i % len(trees)]
                child = kids[rng.randrange(len(kids))]
                sender, recipient = (child, root) if both_ways and (i // len(trees)) % 2 else (root, child)
                command = SendMessage(
                    f"cmd-{i}", SendContext(sender, "run-1", f"call-{i}"),
                    SendArguments(recipient, f"benchmark message {i}: please look at item {i}", "steer"), REPLY_TO,
                )
                name = stream_of(sender if by_sender else root, streams)
                per_stream[name] += 1
                pipe.xadd(name, {"__data__": encode_command(command)})
            await pipe.execute()
    return per_stream


async def count_replies(redis, total: int) -> dict[str, int]:
    """Outcomes of the answers on the benchmark's reply list, and how many are missing."""
    counts: dict[str, int] = {}
    length = await redis.llen(keys.reply_list(REPLY_TO))
    step = 20000
    for start in range(0, length, step):
        for item in await redis.lrange(keys.reply_list(REPLY_TO), start, start + step - 1):
            answer = json.loads(item)
            kind = "ok" if "ok" in answer else answer.get("error", {}).get("code", "other")
            counts[kind] = counts.get(kind, 0) + 1
    if length != total:
        counts["missing_replies"] = total - length
    return counts


async def wait_joined(redis, streams: list[str], count: int, alive, timeout: float = 60) -> None:
    """Until ``count`` workers are in the members set and every stream has a reader, and then one heartbeat
    more: each worker has then seen the last one join and reads only its share (consumers/ownership.py)."""
    deadline = time.perf_counter() + timeout
    while (len(await members.live(redis, ServiceConfig().worker_timeout_ms)) < count
           or not all([await redis.xinfo_consumers(stream, keys.COMMAND_GROUP) for stream in streams])):
        alive()
        if time.perf_counter() > deadline:
            raise TimeoutError(f"{count} workers did not join within {timeout:g} s")
        await asyncio.sleep(0.05)
    await asyncio.sleep(ServiceConfig().worker_timeout_ms / 4000 * 1.5)


async def group_progress(redis: aioredis.Redis, stream: str, group: str) -> tuple[int, int]:
    """(pending, lag) of the group; lag is what nobody has read yet."""
    for info in await redis.xinfo_groups(stream):
        name = info["name"].decode() if isinstance(info["name"], bytes) else info["name"]
        if name == group:
            lag = info.get("lag")
            return int(info["pending"]), int(lag if lag is not None else 1)
    raise RuntimeError(f"no group {group} on {stream}")


async def wait_drained(redis, streams: list[str], group: str, total: int, timeout: float, alive=None) -> float:
    """Seconds from the first command the group read on any stream until pending + lag is zero on all of them.

    Polls every 10 ms.
    """
    deadline = time.perf_counter() + timeout
    first = None
    while True:
        progress = [await group_progress(redis, stream, group) for stream in streams]
        pending = sum(p for p, _ in progress)
        lag = sum(lag for _, lag in progress)
        now = time.perf_counter()
        if first is None and lag < total:
            first = now
        if first is not None and pending == 0 and lag == 0:
            return now - first
        if now > deadline:
            raise TimeoutError(f"not drained after {timeout:.0f} s: pending={pending} lag={lag}")
        if alive:
            alive()
        await asyncio.sleep(0.01)


async def timed_drain(redis, streams: list[str], workers: Workers, count: int, total: int,
                      server_pids: list[int], sample=None) -> dict:
    """Start ``count`` worker processes on a prefilled backlog and time its drain.

    The group cursors are held at the end (`XGROUP SETID $`) until every worker has started and taken its
    share of the streams, then rewound to 0: start-up is not timed. CPU seconds of the servers, of the
    workers and of everything else on the machine (``other_cpu_s``, the noise) are read over the drain.
    """
    for stream in streams:
        await redis.xgroup_setid(stream, keys.COMMAND_GROUP, "$")
    workers.start(count)
    await wait_joined(redis, streams, count, workers.check_alive)
    server_cpu = sum(cpu_seconds(pid) for pid in server_pids)
    worker_cpu = sum(cpu_seconds(p.pid) for p in workers.procs)
    before = await sample() if sample else None
    busy, own = busy_seconds(), time.process_time()
    for stream in streams:
        await redis.xgroup_setid(stream, keys.COMMAND_GROUP, "0", entries_read=0)
    seconds = await wait_drained(redis, streams, keys.COMMAND_GROUP, total, 600, workers.check_alive)
    after = await sample() if sample else None
    server_cpu = sum(cpu_seconds(pid) for pid in server_pids) - server_cpu
    worker_cpu = sum(cpu_seconds(p.pid) for p in workers.procs) - worker_cpu
    other_cpu = max(0.0, busy_seconds() - busy - server_cpu - worker_cpu - (time.process_time() - own))
    out = {"seconds": seconds, "valkey_cpu_s": server_cpu, "worker_cpu_s": worker_cpu, "other_cpu_s": other_cpu}
    if sample:
        out["samples"] = (before, after)
    return out


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    index = min(len(ordered) - 1, max(0, round(q / 100 * (len(ordered) - 1))))
    return ordered[index]


def machine() -> dict[str, str]:
    cpu = "unknown"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {
        "cpu": cpu,
        "cores": str(os.cpu_count()),
        "python": platform.python_version(),
        "os": f"{platform.system()} {platform.release()}",
    }


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of one process so far (0 if it is gone)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return 0.0


def busy_seconds() -> float:
    """CPU seconds all cores spent busy so far (from /proc/stat): minus our own processes, the noise."""
    try:
        fields = Path("/proc/stat").read_text().splitlines()[0].split()[1:]
        user, nice, system, idle, iowait, irq, softirq, steal = (int(x) for x in fields[:8])
        return (user + nice + system + irq + softirq + steal) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError):
        return 0.0


class Server:
    """The server's adapters, built from the URL: what a bench reads or writes below the host API."""

    def __init__(self, config: Config, redis) -> None:
        self.redis = redis
        self.store = EventStore(redis, config.service)
        self.sessions = SessionService(self.store, config)

    async def close(self) -> None:
        await self.redis.aclose()


async def open_server(url: str) -> Server:
    config = bench_config(url)
    return Server(config, await connect(url, config.service))


@contextlib.asynccontextmanager
async def server_of(url: str):
    server = await open_server(url)
    try:
        yield server
    finally:
        await server.close()
