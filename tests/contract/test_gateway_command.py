"""`treemail gateway` as an operator runs it: it says where it listens, answers there, stops on Ctrl-C; with no
server configured it says so in one line."""

import json
import os
import signal
import subprocess
import sys
import urllib.request
from pathlib import Path

TREEMAIL = str(Path(sys.executable).parent / "treemail")


def test_the_gateway_command_serves_v1_and_stops_on_ctrl_c(valkey):
    env = {**os.environ, "REDIS_URL": valkey.url, "TREEMAIL_SERVICE_COMMAND_STREAMS": "1"}
    process = subprocess.Popen([TREEMAIL, "gateway", "--port", "0"], env=env, stdout=subprocess.PIPE, text=True)
    try:
        line = process.stdout.readline()
        assert line.startswith("treemail gateway at http://127.0.0.1:") and line.rstrip().endswith("; Ctrl-C stops it")
        address = line.split(" at ", 1)[1].split(";", 1)[0]
        with urllib.request.urlopen(address, timeout=10) as response:
            assert response.headers["Treemail-Gateway-Version"] == "1"
            assert json.loads(response.read())["gateway_version"] == 1
    finally:
        process.send_signal(signal.SIGINT)
        assert process.wait(timeout=20) == 0


def test_without_a_server_the_gateway_command_says_so_in_one_line():
    env = {k: v for k, v in os.environ.items() if k not in ("REDIS_URL", "TREEMAIL_CONFIG")}
    done = subprocess.run([TREEMAIL, "gateway", "--port", "0"], env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    assert done.stderr.startswith("treemail: error: no server: set REDIS_URL") and done.stderr.count("\n") == 1
