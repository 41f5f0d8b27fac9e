"""Replay rate: `projections.replay.rebuild` (without and with writing the views) next to a raw XRANGE + json.loads loop, same streams.

Sessions are registered through the host API (directory entry, partition session
set, SessionRegistered at version 1), then each stream is filled by a server-side
Lua loop with ProducerRegistered + (ProducerMessageAccepted, ProducerMessageConsumed)
pairs of real event JSON (run.fill_history), to about `events_per_session` events.
"""

import json
import time

import redis.asyncio as aioredis

from treemail.adapters.eventstore import EventStore
from treemail.projections.replay import CHUNK, rebuild
from treemail.adapters import keys
from treemail.adapters.config import ServiceConfig
from treemail.host import Treemail

from .common import bench_config, register_trees, server_of


async def fill(url: str, trees: int, children: int, events_per_session: int, fill_history) -> tuple[int, int]:
    """Returns (sessions, events) written."""
    host = await Treemail.connect(bench_config(url), url)
    try:
        registered = await register_trees(host, trees, children)
    finally:
        await host.close()
    # The streams are filled through the server's adapters: the host API has no storage handle.
    total = 0
    sessions = 0
    async with server_of(url) as server:
        for root, kids in registered:
            for sid, sender in [(root, kids[0])] + [(k, root) for k in kids]:
                total += await fill_history(server, sender, sid, events_per_session)
                sessions += 1
    return sessions, total


async def raw_loop(url: str, partitions: list[int]) -> tuple[float, int]:
    """XRANGE in chunks of CHUNK + json.loads of every `data` field, over every session of the partitions."""
    r = aioredis.Redis.from_url(url)
    try:
        start = time.perf_counter()
        events = 0
        for p in partitions:
            for sid in sorted(s.decode() for s in await r.smembers(keys.partition_sessions(p))):
                stream = keys.session_stream(p, sid)
                after = "-"
                while True:
                    entries = await r.xrange(stream, min=after, count=CHUNK)
                    for _, fields in entries:
                        json.loads(fields[b"data"])
                    events += len(entries)
                    if len(entries) < CHUNK:
                        break
                    after = "(" + entries[-1][0].decode()
        return time.perf_counter() - start, events
    finally:
        await r.aclose()


async def replay(url: str, partitions: list[int], write: bool = False) -> tuple[float, int, dict]:
    """rebuild(write=write) with a fresh EventStore (empty directory cache); returns (seconds, events, views).

    With ``write`` the views and their checkpoints are written too (one MULTI/EXEC per partition): the
    rebuild `treemail replay` runs.
    """
    r = aioredis.Redis.from_url(url)
    store = EventStore(r, ServiceConfig(redis_url=url))
    seen = {"events": 0}

    def progress(done: int, total: int, events: int) -> None:
        seen["events"] = events

    try:
        start = time.perf_counter()
        views = await rebuild(store, partitions, write=write, progress=progress)
        return time.perf_counter() - start, seen["events"], views
    finally:
        await r.aclose()


def check_views(views: dict, sessions: int, events: int) -> dict:
    """The folded trees view must count every accepted and consumed message; inbox must be empty."""
    accepted = done = registered = inbox = 0
    for (name, _), view in views.items():
        data = view.data if hasattr(view, "data") else view
        for field, value in data.items():
            if name == "trees":
                if field.endswith(":accepted"):
                    accepted += int(value)
                elif field.endswith(":done"):
                    done += int(value)
                elif field.endswith(":sessions"):
                    registered += int(value)
            elif name == "inbox" and not field.startswith("seq:"):
                inbox += int(value)
    return {"sessions_in_trees_view": registered, "accepted": accepted, "done": done, "inbox_pending": inbox}
