from pathlib import Path

import pytest
import redis.asyncio as aioredis

from ..conftest import CLUSTER
from .stack import gateway_stack

HERE = Path(__file__).parent


def pytest_collection_modifyitems(items):
    """On a cluster backend these tests skip, saying why: they start one-server stacks (and flush databases)."""
    if not CLUSTER:
        return
    reason = pytest.mark.skip(reason="the host contract and the gateway run on one server: on a cluster every "
                                     "decision is the host API's, which the cluster suite covers")
    for item in items:
        if HERE in Path(item.fspath).parents:
            item.add_marker(reason)


@pytest.fixture(scope="module")
async def contract_stack(valkey):
    """One worker, host and gateway for a module's cases, on a clean database (each case registers its own
    sessions, so cases share the stack as engines share a deployment)."""
    client = aioredis.Redis.from_url(valkey.url)
    await client.execute_command("FLUSHALL", "SYNC")
    await client.aclose()
    async with gateway_stack(valkey.url) as stack:
        yield stack
