"""The host facade stays small: the essentials on ``Treemail`` itself, the rest on its parts.

Counted on a facade built over unconnected clients (nothing is sent): every
name an engine can reach without a leading underscore, attributes included.
"""

import redis.asyncio as aioredis

from treemail.adapters.config import Config
from treemail.host import Treemail

MAX_PUBLIC_NAMES = 25
STORAGE_HANDLES = {"store", "sessions", "redis"}
PARTS = {"history", "peers", "interrupts", "disposal", "permissions", "tools", "obligations"}


def public_names(obj) -> set[str]:
    return {name for name in dir(obj) if not name.startswith("_")}


async def test_the_facade_has_at_most_25_public_names_and_no_storage_handle():
    redis = aioredis.Redis.from_url("redis://127.0.0.1:1")  # never connected: building the facade sends nothing
    host = Treemail(redis, redis, Config())
    try:
        names = public_names(host)
        assert len(names) <= MAX_PUBLIC_NAMES, sorted(names)
        assert names.isdisjoint(STORAGE_HANDLES)
        assert PARTS <= names
        for part in PARTS:
            assert public_names(getattr(host, part)).isdisjoint(STORAGE_HANDLES), part
    finally:
        await host.close()
