"""The debugging commands people run against a live stack: history, tail, approvals, trees."""

import json
import os
import subprocess
import sys

from treemail.projections.render import history_row
from treemail.projections.tail import mail_row

from .conftest import Calls


def cli(redis_url, *args, timeout=60):
    env = {**os.environ, "REDIS_URL": redis_url}
    return subprocess.run([sys.executable, "-m", "treemail", *args], env=env, capture_output=True, text=True,
                          timeout=timeout)


async def test_history_prints_every_event_and_json_for_machines(stack, redis_url):
    root = await stack.register_root("planner", "x", rules={"child": "allow"})
    child = await stack.register_child(root.session_id, "explore", "x")
    await stack.start_run(root.session_id, "run-1")
    await stack.send_message(Calls().ctx(root.session_id), {"to": child.handle, "body": "look here"})
    events = await stack.history(child.session_id)
    rows = cli(redis_url, "history", child.session_id)
    assert rows.returncode == 0, rows.stderr
    assert rows.stdout.splitlines() == [history_row(seq, e) for seq, e in events]
    machine = cli(redis_url, "history", child.session_id, "--json")
    parsed = [json.loads(line) for line in machine.stdout.splitlines()]
    assert [p["type"] for p in parsed] == [type(e).__name__ for _, e in events]
    assert parsed[-1]["body"] == "look here" and parsed[-1]["seq"] == events[-1][0]


async def test_tail_from_start_prints_the_mail_rows_then_follows(stack, redis_url):
    root = await stack.register_root("planner", "x", rules={"child": "allow"})
    child = await stack.register_child(root.session_id, "explore", "x")
    await stack.start_run(root.session_id, "run-1")
    calls = Calls()
    for i in range(3):
        await stack.send_message(calls.ctx(root.session_id), {"to": child.handle, "body": f"m{i}"})
    expected = [r for seq, e in await stack.history(child.session_id) if (r := mail_row(seq, e))]
    env = {**os.environ, "REDIS_URL": redis_url}
    process = subprocess.Popen([sys.executable, "-m", "treemail", "tail", child.session_id, "--from-start"],
                               env=env, stdout=subprocess.PIPE, text=True)
    try:
        got = [process.stdout.readline().rstrip("\n") for _ in expected]
        assert process.poll() is None  # still following
    finally:
        process.terminate()
        process.wait(timeout=30)
    assert got == expected and len(expected) == 3


async def test_unknown_session_and_bad_approval_ids_are_clear_errors(stack, redis_url):
    missing = cli(redis_url, "history", "01a228af-0000-7000-8000-000000000000")
    assert missing.returncode == 2 and "no session has id" in missing.stderr and "Traceback" not in missing.stderr
    approve = cli(redis_url, "approvals", "approve")
    assert approve.returncode == 2 and "need a request id" in approve.stderr
    unknown = cli(redis_url, "approvals", "deny", "nope")
    assert unknown.returncode == 2 and "no approval request has id nope" in unknown.stderr
