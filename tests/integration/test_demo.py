"""`make run` runs `treemail demo`: the scripted tree must go through the real stack."""

import os
import subprocess
import sys


def test_demo_runs_the_scripted_tree_and_stops_cleanly():
    env = {k: v for k, v in os.environ.items() if k != "REDIS_URL"}
    done = subprocess.run(
        [sys.executable, "-m", "treemail.cli", "demo", "--once"], env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    out = done.stdout
    assert "started embedded Valkey" in out
    assert "accepted (running)" in out
    assert "send_message:inflight_full" in out
    assert "unknown subagent reference" in out
    assert out.rstrip().endswith("stopped")
    assert "Traceback" not in done.stderr
