"""Shared pieces of the fault tests: a pool of real `treemail worker` processes, and the invariant checks."""

import asyncio
import collections
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field

import redis.asyncio as aioredis

from tests.integration.conftest import WORKER_ENV, make_config, messaging_env, wait_for_workers
from treemail.adapters import keys
from treemail.adapters.config import Config
from treemail.adapters.viewstore import feed_position, load_view
from treemail.domain import events as ev
from treemail.projections.replay import rebuild
from treemail.projections.views import PROJECTIONS

ALL_RELATIONS = {"parent": "allow", "child": "allow", "sibling": "allow"}


def config_for(url: str, profile: str = "fast", decision_timeout_s: float = 20.0, **messaging) -> Config:
    """The integration suite's config with a longer decision deadline (kills make decisions slower)."""
    base = make_config(url, profile, **messaging)
    return base.model_copy(update={"service": base.service.model_copy(update={"decision_timeout_s": decision_timeout_s})})


async def load_until(enough, at_least_s: float, deadline_s: float = 240.0, what: str = "the load") -> float:
    """Let a load run for at least ``at_least_s`` and until ``enough()`` holds: a load is sized by what it
    must exercise, never by a count reached in a fixed time, which a busy machine misses. Fails only past
    ``deadline_s``, far from what a loaded machine needs. Returns the seconds it ran."""
    loop = asyncio.get_running_loop()
    started = loop.time()
    await asyncio.sleep(at_least_s)
    while not enough():
        assert loop.time() - started < deadline_s, f"{what} did not reach its amounts within {deadline_s:g} s"
        await asyncio.sleep(0.1)
    return loop.time() - started


def accepted(results) -> int:
    """How many of a load's results (tuples ending in the send's result) were accepted."""
    return sum(1 for *_, result in results if "message_id" in result)


def code(result: dict) -> str | None:
    return result.get("error", {}).get("code")


class WorkerPool:
    """Real `treemail worker` processes (spawned as worker_processes does); every one started is stopped at exit."""

    def __init__(self, url: str, extra_env: dict[str, str] | None = None, **messaging) -> None:
        self.env = {**os.environ, "REDIS_URL": url, **WORKER_ENV, **messaging_env(**messaging), **(extra_env or {})}
        self.url = url
        self.started: list[subprocess.Popen] = []
        self.killed: list[subprocess.Popen] = []
        self.logs = tempfile.TemporaryDirectory(prefix="treemail-fault-workers-")

    def spawn(self) -> subprocess.Popen:
        log = open(os.path.join(self.logs.name, f"worker-{len(self.started)}.log"), "wb")
        process = subprocess.Popen(
            [sys.executable, "-m", "treemail", "worker"], env=self.env, start_new_session=True,
            stdout=log, stderr=subprocess.STDOUT,
        )
        log.close()
        process.log_path = log.name  # type: ignore[attr-defined]
        self.started.append(process)
        return process

    def live(self) -> list[subprocess.Popen]:
        return [p for p in self.started if p.poll() is None]

    def kill_random(self, rng: random.Random) -> subprocess.Popen | None:
        live = self.live()
        if not live:
            return None
        victim = rng.choice(live)
        os.kill(victim.pid, signal.SIGKILL)
        victim.wait()
        self.killed.append(victim)
        return victim

    def output(self, process: subprocess.Popen) -> str:
        with open(process.log_path, "rb") as log:  # type: ignore[attr-defined]
            return log.read().decode(errors="replace")

    async def __aenter__(self) -> "WorkerPool":
        return self

    async def start(self, count: int) -> None:
        for _ in range(count):
            self.spawn()
        await wait_for_workers(self.url, count)

    async def __aexit__(self, *exc) -> None:
        for process in self.started:
            if process.poll() is None:
                process.terminate()
        for process in self.started:
            try:
                await asyncio.to_thread(process.wait, 30)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        self.logs.cleanup()


@dataclass
class Tree:
    """Sessions of one delegation tree with their neighbours (parent, children, siblings)."""

    handles: dict[str, str] = field(default_factory=dict)
    neighbours: dict[str, list[str]] = field(default_factory=dict)

    def add(self, registration, parent: str | None) -> None:
        self.handles[registration.session_id] = registration.handle
        self.neighbours.setdefault(registration.session_id, [])
        if parent is not None:
            siblings = [s for s in self.neighbours[parent] if self._parent.get(s) == parent]
            for sibling in siblings:
                self.neighbours[sibling].append(registration.session_id)
                self.neighbours[registration.session_id].append(sibling)
            self.neighbours[parent].append(registration.session_id)
            self.neighbours[registration.session_id].append(parent)
            self._parent[registration.session_id] = parent

    def __post_init__(self) -> None:
        self._parent: dict[str, str] = {}

    @property
    def sessions(self) -> list[str]:
        return list(self.handles)


async def build_tree(host, fanout: list[int], status: str = "running") -> Tree:
    """A root and ``fanout[0]`` children, each with ``fanout[1]`` children, ...; every session may message
    its parent, children and siblings."""
    tree = Tree()
    root = await host.register_root("planner", "root", rules=ALL_RELATIONS, status=status)
    tree.add(root, None)
    level = [root.session_id]
    for n, width in enumerate(fanout):
        nxt = []
        for parent in level:
            for _ in range(width):
                child = await host.register_child(parent, f"agent{n}", "x", rules=ALL_RELATIONS, status=status)
                tree.add(child, parent)
                nxt.append(child.session_id)
        level = nxt
    return tree


async def caught_up(redis, partitions: int) -> bool:
    """Every projection's checkpoint is where its partition's feed ends."""
    for p in range(partitions):
        end, _ = await feed_position(redis, p)
        for name in PROJECTIONS:
            _, checkpoint = await load_view(redis, p, name)
            if end.entries and (checkpoint is None or checkpoint.entry_id != end.entry_id):
                return False
    return True


async def views_against_a_rebuild(store, partitions: int, timeout_s: float = 30.0) -> tuple[bool, int]:
    """Whether the projection worker's stored views equal a rebuild from the session streams, and how many
    comparisons were started again because a feed moved during them.

    Compared once the worker has folded every feed to its end, and kept only if no feed moved from before the
    views are read until the rebuild has read the streams: an event appended in between (the pump releasing a
    claim whose attempt timed out) would otherwise show as a difference no projection made."""
    deadline = time.monotonic() + timeout_s
    moved = 0
    ever_caught_up = False
    while True:
        ends = [(await feed_position(store.redis, p))[0] for p in range(partitions)]
        if await caught_up(store.redis, partitions):
            ever_caught_up = True
            stored = {(name, p): dict((await load_view(store.redis, p, name))[0])
                      for p in range(partitions) for name in PROJECTIONS}
            replayed = await rebuild(store, list(range(partitions)), write=False)
            if [(await feed_position(store.redis, p))[0] for p in range(partitions)] == ends:
                return stored == {key: dict(view) for key, view in replayed.items()}, moved
            moved += 1
        assert time.monotonic() < deadline, (
            f"the views were not compared with a rebuild within {timeout_s:.0f} s: "
            + (f"the feeds moved during each of {moved} comparisons" if ever_caught_up
               else "the projection worker never caught up with the feeds"))
        await asyncio.sleep(0.2)


async def histories(host, sessions) -> dict[str, list[tuple[int, ev.Event]]]:
    return {s: await host.history(s) for s in sessions}


def check_streams(all_histories, results, messaging: dict, allowed_refusals: set[str]) -> collections.Counter:
    """The invariants every fault test checks; returns the outcome counter.

    ``results``: (sender, run_id, tool_call_id, recipient, result) of every answered send.
    """
    outcomes = collections.Counter("ok" if "message_id" in r else code(r) for *_, r in results)
    # Every send got an answer the contract allows (no engine_shutdown, nothing unexpected).
    assert set(outcomes) <= {"ok", *allowed_refusals}, outcomes

    accepted: dict[str, list[tuple[str, ev.ProducerMessageAccepted]]] = collections.defaultdict(list)
    by_key = collections.Counter()
    for session, history in all_histories.items():
        seqs = [seq for seq, _ in history]
        assert seqs == sorted(seqs) and len(set(seqs)) == len(seqs), f"{session}: stream out of order"
        for _, event in history:
            if isinstance(event, ev.ProducerMessageAccepted) and event.owner == "agent":
                accepted[event.message_id].append((session, event))
                by_key[(event.sender_session_id, event.run_id, event.tool_call_id)] += 1
    # One event per idempotency key, and one per message id.
    assert [k for k, n in by_key.items() if n != 1] == []
    assert [m for m, where in accepted.items() if len(where) != 1] == []
    # Every accepted answer names exactly one event, in its recipient's stream, for that tool call.
    ok = {r["message_id"]: (sender, run, call, recipient) for sender, run, call, recipient, r in results
          if "message_id" in r}
    for message_id, (sender, run, call, recipient) in ok.items():
        [(session, event)] = accepted.get(message_id, [(None, None)])
        assert session == recipient, (message_id, session, recipient)
        assert (event.sender_session_id, event.run_id, event.tool_call_id) == (sender, run, call)
    # Nothing was accepted that its sender was not told about.
    assert set(accepted) == set(ok)
    check_guards(all_histories, messaging)
    return outcomes


def check_guards(all_histories, messaging: dict) -> None:
    """Replay each recipient's stream: at no point more pending agent mail, or per-pair unacknowledged
    mail, than the guards allow."""
    max_pending = messaging["max_pending_per_session"]
    window = messaging["max_inflight_per_pair"]
    for session, history in all_histories.items():
        pending = 0
        pairs = collections.Counter()
        for seq, event in history:
            if getattr(event, "owner", None) != "agent":
                continue
            if isinstance(event, ev.ProducerMessageAccepted):
                pending += 1
                pairs[event.sender_session_id] += 1
            elif isinstance(event, ev.ProducerMessageConsumed | ev.ProducerMessageDiscarded):
                pending -= 1
                pairs[event.sender_session_id] -= 1
            else:
                continue
            assert 0 <= pending <= max_pending, f"{session}@{seq}: {pending} pending agent messages"
            if window:
                sender, inflight = pairs.most_common(1)[0]
                assert inflight <= window, f"{session}@{seq}: {inflight} unacknowledged from {sender}"
            assert min(pairs.values()) >= 0, f"{session}@{seq}: more done than accepted"


async def consumer_idle_ms(url: str, stream_count: int) -> dict[str, int]:
    """Per command-group consumer name, the smallest idle time over the command streams."""
    client = aioredis.Redis.from_url(url)
    try:
        out: dict[str, int] = {}
        for index in range(stream_count):
            for consumer in await client.xinfo_consumers(keys.command_stream(index), keys.COMMAND_GROUP):
                name = consumer["name"].decode() if isinstance(consumer["name"], bytes) else consumer["name"]
                out[name] = min(out.get(name, consumer["idle"]), consumer["idle"])
        return out
    finally:
        await client.aclose()
