import pytest
import redis.asyncio as aioredis

from ..conftest import CLUSTER
from .stack import gateway_stack


@pytest.fixture(scope="module")
async def contract_stack(valkey):
    """One worker, host and gateway for a module's cases, on a clean database (each case registers its own
    sessions, so cases share the stack as engines share a deployment)."""
    if CLUSTER:
        pytest.skip("the host contract runs on one server: on a cluster every decision is the host API's, "
                    "which the cluster suite covers")
    client = aioredis.Redis.from_url(valkey.url)
    await client.execute_command("FLUSHALL", "SYNC")
    await client.aclose()
    async with gateway_stack(valkey.url) as stack:
        yield stack
