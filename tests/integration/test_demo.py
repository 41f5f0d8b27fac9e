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
    # It says what differs from a default install: nothing kept, and the hop guard it turned on.
    assert "nothing is kept across a restart" in out
    assert "max_hops = 4" in out and "say 0" in out
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

    from .conftest import one_send

    process = subprocess.Popen([sys.executable, "-m", "treemail", "cluster", "--workers", "2"],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        out = ""
        while "Ctrl-C" not in out:
            out += process.stdout.readline()
        url = re.search(r"REDIS_URL=(\S+)", out).group(1)
        ports = [int(p) for p in re.findall(r"127\.0\.0\.1:(\d+)", out.splitlines()[0])]
        assert len(ports) == 3

        config = Config(service=ServiceConfig(redis_url=url, cluster=True))
        assert "message_id" in asyncio.run(one_send(config, url))
    finally:
        process.send_signal(signal.SIGINT)
        stdout, stderr = process.communicate(timeout=60)
    assert process.returncode == 0, stderr
    assert stdout.rstrip().endswith("stopped")


def _demo_env(**extra) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("REDIS_URL", "TREEMAIL_CONFIG")}
    return {**env, **extra}


def test_the_demo_ends_with_what_to_try_next_and_those_commands_work():
    import re
    import signal

    process = subprocess.Popen([sys.executable, "-m", "treemail", "demo"], env=_demo_env(),
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    out = ""
    try:
        while "stack is up" not in out:
            line = process.stdout.readline()
            assert line, out + process.stderr.read()
            out += line
        url = re.search(r"export REDIS_URL=(\S+)", out).group(1)
        commands = re.findall(r"^  (\S*treemail [^#\n]*?)\s+#", out, re.M)
        assert [c.split("treemail ", 1)[1].split()[0] for c in commands] == [
            "trees", "history", "tail", "timeline", "ui", "approvals", "approvals"]
        assert re.search(r"treemail ui\s+#.*http://127\.0\.0\.1:8780/", out)  # the page's address
        env = {**os.environ, "REDIS_URL": url}
        env.pop("TREEMAIL_CONFIG", None)

        def run(command: str) -> str:
            args = command.split("treemail ", 1)[1].split()
            done = subprocess.run([sys.executable, "-m", "treemail", *args], env=env, capture_output=True,
                                  text=True, timeout=60)
            assert done.returncode == 0, (command, done.stderr)
            return done.stdout

        # The projection worker the demo runs has the tree: trees is not just a header.
        assert re.search(r"\s4\s", run(commands[0])), run(commands[0])
        history = run(commands[1])
        assert "ProducerMessageAccepted" in history and '{"' not in history  # friendly rows, no raw JSON
        timeline = run(commands[3])
        assert "mailbox" in timeline and "consumed" in timeline and "steps" in timeline
        assert "writer_" in run(commands[5])
        assert "approved" in run(commands[6])
        # The waiting send goes through once a person approves it, and the demo says so.
        while "accepted" not in (line := process.stdout.readline()):
            assert line, "the demo did not report the approved send"
    finally:
        process.send_signal(signal.SIGINT)
        rest, err = process.communicate(timeout=60)
    assert process.returncode == 0, err
    assert "Traceback" not in err and "port 9464 is taken" not in out + rest + err
    assert "started 2 worker processes and a projection worker" in out
    assert "logs of the processes the demo started:" in out


def test_the_demo_says_when_its_configuration_turns_the_hop_guard_off():
    done = subprocess.run([sys.executable, "-m", "treemail", "demo", "--once"], capture_output=True, text=True,
                          timeout=120, env=_demo_env(TREEMAIL_MESSAGING_MAX_HOPS="0"))
    assert done.returncode == 0, done.stderr
    assert "skipped: the hop guard is off (max_hops = 0" in done.stdout
    assert "max_hops_exceeded" not in done.stdout


def test_a_scenario_that_does_not_happen_fails_the_demo():
    done = subprocess.run([sys.executable, "-m", "treemail", "demo", "--once"], capture_output=True, text=True,
                          timeout=120, env=_demo_env(TREEMAIL_MESSAGING_ENABLED="false"))
    assert done.returncode == 1
    assert "treemail demo: scenario 1:" in done.stderr and "Traceback" not in done.stderr
    assert done.stdout.rstrip().endswith("stopped")


async def test_against_a_server_whose_workers_lack_max_hops_the_demo_says_so(redis_url):
    from .conftest import worker_processes

    async with worker_processes(redis_url, 1):  # max_hops 0: no hop guard
        import asyncio

        done = await asyncio.to_thread(
            subprocess.run, [sys.executable, "-m", "treemail", "demo", "--once"], capture_output=True, text=True,
            timeout=120, env=_demo_env(REDIS_URL=redis_url))
    assert done.returncode == 0, done.stderr
    assert f"using the server at {redis_url}" in done.stdout
    assert "note: 1 other worker(s) on this server decide sends too, with their own max_hops" in done.stdout


def test_ctrl_c_in_the_middle_of_the_script_stops_everything_quietly():
    import re
    import signal
    import socket

    process = subprocess.Popen([sys.executable, "-m", "treemail", "demo"], env=_demo_env(),
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    out = ""
    while "1. a child reports" not in out:
        line = process.stdout.readline()
        assert line, out
        out += line
    process.send_signal(signal.SIGINT)
    rest, err = process.communicate(timeout=60)
    assert process.returncode == 0, err
    assert rest.rstrip().endswith("stopped") and "stack is up" not in rest
    assert "Traceback" not in err
    port = int(re.search(r"127\.0\.0\.1:(\d+)", out).group(1))
    with socket.socket() as sock:
        assert sock.connect_ex(("127.0.0.1", port)) != 0
