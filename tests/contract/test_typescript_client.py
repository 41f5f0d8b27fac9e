"""The TypeScript host client's own suite (`make test-typescript`: npm ci, tsc, node --test), run from the
Python suite so the whole suite includes it: the host contract over the gateway, the client's cancellation
and errors, and the docs page's engine loop."""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.xdist_group("builds-in-the-source-tree")  # writes clients/typescript/{node_modules,dist}


def test_the_typescript_client_builds_and_keeps_the_host_contract():
    missing = [tool for tool in ("node", "npm", "make") if shutil.which(tool) is None]
    if missing:
        pytest.skip(f"{', '.join(missing)} not installed: the TypeScript client's suite needs Node.js 20 and npm")
    env = {**os.environ, "TREEMAIL_PYTHON": sys.executable}  # the stacks the node tests start run this Python
    done = subprocess.run(["make", "--no-print-directory", "test-typescript"],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, f"make test-typescript failed:\n{done.stdout[-6000:]}\n{done.stderr[-4000:]}"
    assert "# fail 0" in done.stdout and "# pass" in done.stdout
