"""`make run` runs `treemail demo`: the scripted tree must go through the real stack."""

import os
import subprocess
import sys


def test_demo_runs_the_scripted_tree_and_stops_cleanly():
    env = {k: v for k, v in os.environ.items() if k != "REDIS_URL"}
    done = subprocess.run(
        [sys.executable, "-m", "treemail", "demo", "--once"], env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    out = done.stdout
    assert "started embedded Valkey" in out
    assert "accepted, recipient running" in out
    assert "accepted, recipient waking_finished" in out
    assert "starts a new run with its mail as input" in out
    assert '<agent_message from="planner_' in out
    assert "send_message:max_hops_exceeded" in out
    assert out.rstrip().endswith("stopped")
    assert "Traceback" not in done.stderr


def test_ctrl_c_stops_everything_the_demo_started():
    import re
    import signal
    import socket
    import time

    env = {k: v for k, v in os.environ.items() if k != "REDIS_URL"}
    process = subprocess.Popen(
        [sys.executable, "-m", "treemail", "demo"], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True,
    )
    lines = []
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        line = process.stdout.readline()
        lines.append(line)
        if "stack is up" in line:
            break
    port = int(re.search(r"127\.0\.0\.1:(\d+)", "".join(lines)).group(1))
    process.send_signal(signal.SIGINT)
    out, err = process.communicate(timeout=60)
    assert process.returncode == 0, err
    assert out.rstrip().endswith("stopped")
    assert "Traceback" not in err
    with socket.socket() as sock:
        assert sock.connect_ex(("127.0.0.1", port)) != 0  # the embedded Valkey is gone


def test_server_command_stops_its_valkey_on_sigterm():
    import re
    import signal
    import socket

    process = subprocess.Popen([sys.executable, "-m", "treemail", "server"], stdout=subprocess.PIPE, text=True)
    port = int(re.search(r":(\d+)/", process.stdout.readline()).group(1))
    process.send_signal(signal.SIGTERM)
    assert process.wait(timeout=30) == 0
    with socket.socket() as sock:
        assert sock.connect_ex(("127.0.0.1", port)) != 0


def test_cluster_command_starts_a_working_cluster_stack_and_stops_it():
    import asyncio
    import re
    import signal

    from treemail.adapters.config import Config, ServiceConfig
    from treemail.host import SendContext, Treemail

    process = subprocess.Popen([sys.executable, "-m", "treemail", "cluster", "--workers", "2"],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        out = ""
        while "Ctrl-C" not in out:
            out += process.stdout.readline()
        url = re.search(r"REDIS_URL=(\S+)", out).group(1)
        ports = [int(p) for p in re.findall(r"127\.0\.0\.1:(\d+)", out.splitlines()[0])]
        assert len(ports) == 3

        async def send():
            config = Config(service=ServiceConfig(redis_url=url, cluster=True))
            host = await Treemail.connect(config, url)
            try:
                root = await host.register_root("planner", "x", rules={"child": "allow"})
                child = await host.register_child(root.session_id, "explore", "x")
                await host.start_run(root.session_id, "r")
                return await host.send_message(SendContext(root.session_id, "r", "c"), {"to": child.handle, "body": "hi"})
            finally:
                await host.close()

        assert "message_id" in asyncio.run(send())
    finally:
        process.send_signal(signal.SIGINT)
        stdout, stderr = process.communicate(timeout=60)
    assert process.returncode == 0, stderr
    assert stdout.rstrip().endswith("stopped")
