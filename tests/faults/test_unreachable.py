"""Scale-out and faults: a projection worker started against a server that is not there."""

import os
import subprocess
import sys
import time

import pytest

from treemail.adapters.embedded import free_port


@pytest.mark.slow
@pytest.mark.expected_duration_s(10)
def test_unreachable_valkey_at_start_is_a_clear_error():
    url = f"redis://127.0.0.1:{free_port()}/0"  # a closed port: nothing listens
    env = {**os.environ, "REDIS_URL": url, "TREEMAIL_SERVICE_CONNECT_ATTEMPTS": "3",
           "TREEMAIL_PROJECTION_METRICS_PORT": "-1"}
    env.pop("TREEMAIL_CONFIG", None)
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "treemail", "projections"], env=env, capture_output=True,
                          text=True, timeout=45)
    elapsed = time.monotonic() - started
    assert done.returncode == 2, done.stderr
    assert "cannot reach Redis/Valkey" in done.stderr
    assert url in done.stderr
    assert "Traceback" not in done.stderr and "Traceback" not in done.stdout
    assert elapsed < 30  # bounded retries, not a hang
