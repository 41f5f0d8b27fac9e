"""The CLI as people use it: every error they can cause is one line and a non-zero exit, never a traceback;
data comes as JSON on request; a session can be named by its handle."""

import json
import os
import socket
import subprocess
import sys
from importlib.metadata import version

import pytest
import typer

import treemail
from treemail.adapters import keys
from treemail.adapters.embedded import LocalValkeyCluster
from treemail.entrypoints.cli import app
from treemail.projections.render import history_row

from ..conftest import CLUSTER
from .conftest import Calls, adapters


def cli(redis_url, *args, timeout=60, **env):
    full = {**os.environ, "REDIS_URL": redis_url, **env}
    full.pop("TREEMAIL_CONFIG", None)
    return subprocess.run([sys.executable, "-m", "treemail", *args], env=full, capture_output=True, text=True,
                          timeout=timeout)


def one_line_error(done) -> str:
    assert done.returncode != 0, done
    assert "Traceback" not in done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("treemail: error: "), done.stderr
    return lines[0]


def test_version_is_the_package_version():
    done = cli("", "--version")
    assert done.returncode == 0
    assert done.stdout.split()[:2] == ["treemail", version("treemail")]
    assert treemail.__version__ == version("treemail")


def test_every_argument_and_option_has_help():
    missing = []

    def walk(command, path):
        for param in command.params:
            if param.name != "help" and not getattr(param, "help", None):
                missing.append(f"{path} {param.name}")
        for name, sub in getattr(command, "commands", {}).items():
            if not sub.help:
                missing.append(f"{path} {name} (the command)")
            walk(sub, f"{path} {name}")

    walk(typer.main.get_command(app), "treemail")
    assert not missing, missing


def test_config_is_accepted_before_or_after_the_subcommand(tmp_path):
    path = tmp_path / "treemail.toml"
    path.write_text("[messaging]\nmax_hop = 3\n")
    for args in (("--config", str(path), "trees"), ("trees", "--config", str(path)),
                 ("approvals", "list", "--config", str(path))):
        assert "unknown key `messaging.max_hop`" in one_line_error(cli("redis://127.0.0.1:1/0", *args)), args


def test_a_bad_metrics_port_breaks_only_the_command_that_uses_it():
    env = {"TREEMAIL_PROJECTION_METRICS_PORT": "nine", "TREEMAIL_METRICS_PORT": "x"}
    assert cli("", "--help", **env).returncode == 0
    assert cli("", "projections", "--help", **env).returncode == 0
    assert cli("", "schema", **env).returncode == 0
    assert "TREEMAIL_PROJECTION_METRICS_PORT" in one_line_error(cli("", "projections", **env))
    assert "TREEMAIL_METRICS_PORT" in one_line_error(cli("", "worker", **env))


def test_a_bad_pump_setting_breaks_only_the_pump():
    env = {"TREEMAIL_PUMP_INTERVAL_S": "0", "TREEMAIL_PUMP_METRICS_PORT": "many"}
    assert cli("", "schema", **env).returncode == 0
    assert "TREEMAIL_PUMP_METRICS_PORT" in one_line_error(cli("", "pump", **env))
    del env["TREEMAIL_PUMP_METRICS_PORT"]
    assert "TREEMAIL_PUMP_INTERVAL_S" in one_line_error(cli("", "pump", **env))


@pytest.mark.parametrize("args,says", [
    (("dead-letters", "--count", "0"), "--count"),
    (("trees", "--sessions", "0"), "--sessions"),
    (("ui", "--sessions", "x"), "--sessions"),
    (("no-such-command",), "No such command"),
    (("history",), "Missing argument"),
    (("worker", "--metrics-port", "70000"), "--metrics-port"),
    (("approvals", "approve"), "need a request id"),
    (("--log-format", "xml", "schema"), "--log-format"),
    (("search", "s", "--since", "nan"), "--since must be a finite number"),
    (("search", "s", "--until", "inf"), "--until must be a finite number"),
    (("pump", "--interval", "inf"), "--interval"),
    (("mcp-token", "s", "--ttl", "99999999999999999999"), "--ttl"),
])
def test_usage_errors_are_one_line(args, says):
    assert says in one_line_error(cli("redis://127.0.0.1:1/0", *args))


def test_output_that_cannot_be_written_is_one_line_that_says_so_not_a_server_error():
    with open("/dev/full", "w") as full:
        done = subprocess.run([sys.executable, "-m", "treemail", "schema"], stdout=full, stderr=subprocess.PIPE,
                              text=True, timeout=60)
    assert one_line_error(done) == "treemail: error: cannot write the output: No space left on device"


def test_without_a_server_address_the_advice_is_one_a_person_can_follow(tmp_path):
    env = {k: v for k, v in os.environ.items() if k not in ("REDIS_URL", "TREEMAIL_CONFIG")}
    env.pop("TREEMAIL_SERVICE_REDIS_URL", None)
    env["XDG_CONFIG_HOME"] = str(tmp_path)  # no user or workspace treemail.toml naming a server either
    done = subprocess.run([sys.executable, "-m", "treemail", "trees"], env=env, capture_output=True, text=True,
                          timeout=60, cwd=tmp_path)
    line = one_line_error(done)
    # No default address exists, so none is implied; the command that gives one is named.
    assert "no server: set REDIS_URL" in line and "`treemail server`" in line, line
    assert "6379" not in line


async def test_empty_listings_say_so(redis_url):
    assert cli(redis_url, "approvals", "list").stdout.strip() == "no approval requests are waiting"
    assert cli(redis_url, "dead-letters").stdout.strip() == "no dead letters"
    assert "no trees in the views yet" in cli(redis_url, "trees").stdout


async def test_dead_letters_say_what_the_page_and_the_bound_leave_out(stack, redis_url):
    redis = adapters(stack).redis
    for n in range(5):  # an exact bound of 3: the two oldest letters are trimmed, as the stream's own bound does
        await redis.xadd(keys.dead_letters(), {"reason": "malformed", "stream": "s", "entry_id": f"{n}-0",
                                               "consumer": "c", "data": f"letter {n}"}, maxlen=3, approximate=False)

    page = cli(redis_url, "dead-letters", "--count", "2", "--json")
    assert [json.loads(line)["data"] for line in page.stdout.splitlines()] == ["letter 4", "letter 3"]
    assert page.stderr.splitlines() == [
        "more: 1 older dead letters kept; see them with --count 3",
        "trimmed: 2 older dead letters are no longer kept (the stream keeps about the last 10,000)"]
    whole = cli(redis_url, "dead-letters", "--count", "3")
    assert whole.returncode == 0 and "letter 2" in whole.stdout
    assert whole.stderr.splitlines() == [page.stderr.splitlines()[1]]


async def test_data_commands_speak_json(stack, redis_url):
    root = await stack.register_root("planner", "x", rules={"child": "allow"})
    child = await stack.register_child(root.session_id, "explore", "x", rules={"parent": "ask"})
    await stack.start_run(child.session_id, "r")
    import asyncio

    waiting = asyncio.create_task(stack.send_message(Calls().ctx(child.session_id, "r"),
                                                     {"to": root.handle, "body": "may I?"}))
    while not await stack.permissions.pending_approvals():
        await asyncio.sleep(0.02)
    await adapters(stack).redis.xadd(keys.dead_letters(), {"reason": "malformed", "stream": "s", "entry_id": "1-0",
                                                 "consumer": "c", "data": "{not json"})
    from treemail.projections.replay import rebuild

    await rebuild(adapters(stack).store, list(range(adapters(stack).config.service.partitions)))
    try:
        approvals = [json.loads(line) for line in cli(redis_url, "approvals", "list", "--json").stdout.splitlines()]
        assert [a["body"] for a in approvals] == ["may I?"] and approvals[0]["sender_handle"] == child.handle
        assert child.handle in cli(redis_url, "approvals", "list").stdout
        letters = [json.loads(line) for line in cli(redis_url, "dead-letters", "--json").stdout.splitlines()]
        assert letters[0]["reason"] == "malformed" and letters[0]["data"] == "{not json"
        trees = [json.loads(line) for line in cli(redis_url, "trees", "--json").stdout.splitlines()]
        assert [(t["root_session_id"], t["sessions"]) for t in trees] == [(root.session_id, 2)]
    finally:
        waiting.cancel()
        await asyncio.gather(waiting, return_exceptions=True)


async def test_trees_shows_each_tree_by_handle_nested_with_statuses_as_the_page_does(stack, redis_url):
    from treemail.projections.replay import rebuild

    root = await stack.register_root("planner", "x", rules={"child": "allow"})
    child = await stack.register_child(root.session_id, "explore", "x", rules={"parent": "allow"})
    grandchild = await stack.register_child(child.session_id, "grep", "x", status="idle")
    await stack.start_run(root.session_id, "r")
    await stack.send_message(Calls().ctx(root.session_id, "r"), {"to": child.handle, "body": "look", "mode": "queue"})
    await rebuild(adapters(stack).store, list(range(adapters(stack).config.service.partitions)))

    (tree,) = [json.loads(line) for line in cli(redis_url, "trees", "--json").stdout.splitlines()]
    assert (tree["root_session_id"], tree["root_handle"], tree["sessions"]) == (root.session_id, root.handle, 3)
    assert [(m["handle"], m["depth"], m["status"], m["pending"]) for m in tree["members"]] == [
        (root.handle, 0, "running", 0), (child.handle, 1, "queued", 1), (grandchild.handle, 2, "idle", 0)]

    lines = cli(redis_url, "trees").stdout.splitlines()
    shown = {handle: next(line for line in lines if handle in line)
             for handle in (root.handle, child.handle, grandchild.handle)}
    assert "running" in shown[root.handle] and root.session_id not in "".join(lines)  # handles, not ids
    assert f"  └ {child.handle}" in shown[child.handle] and "queued" in shown[child.handle]
    assert f"    └ {grandchild.handle}" in shown[grandchild.handle]


async def test_history_and_tail_take_a_handle(stack, redis_url):
    root = await stack.register_root("planner", "x", rules={"child": "allow"})
    child = await stack.register_child(root.session_id, "explore", "x")
    await stack.start_run(root.session_id, "run-1")
    sent = await stack.send_message(Calls().ctx(root.session_id), {"to": child.handle, "body": "by handle"})
    assert "message_id" in sent, sent
    expected = [history_row(seq, e) for seq, e in await stack.history(child.session_id)]
    by_handle = cli(redis_url, "history", child.handle)
    assert by_handle.returncode == 0, by_handle.stderr
    assert by_handle.stdout.splitlines() == expected
    env = {**os.environ, "REDIS_URL": redis_url}
    follow = subprocess.Popen([sys.executable, "-m", "treemail", "tail", child.handle, "--from-start"], env=env,
                              stdout=subprocess.PIPE, text=True)
    try:
        assert "by handle" in follow.stdout.readline()
    finally:
        follow.terminate()
        follow.wait(timeout=30)
    assert "no session has id or handle 'nobody_00000000'" in one_line_error(
        cli(redis_url, "history", "nobody_00000000"))


async def test_a_handle_two_trees_share_is_a_one_line_error(stack, redis_url):
    first = await stack.register_root("planner", "x")
    second = await stack.register_root("planner", "y")
    # Handles are unique per tree only: give the second tree the first one's handle, as a collision would.
    record = await adapters(stack).sessions.record(second.session_id)
    await adapters(stack).redis.hset(keys.tree_handles(record.partition, second.session_id), first.handle, second.session_id)
    await adapters(stack).redis.sadd(keys.partition_sessions(record.partition), second.session_id)
    line = one_line_error(cli(redis_url, "history", first.handle))
    assert "names 2 sessions" in line and first.session_id in line and second.session_id in line


async def test_history_into_head_ends_quietly(stack, redis_url):
    root = await stack.register_root("planner", "x")
    for i in range(120):
        await stack.inject(root.session_id, "plugin", f"note {i} " + "x" * 2000)
    env = {**os.environ, "REDIS_URL": redis_url}
    done = subprocess.run(f"{sys.executable} -m treemail history {root.session_id} --json | head -n 1",
                          shell=True, env=env, capture_output=True, text=True, timeout=60)
    assert done.stdout.count("\n") == 1
    assert done.stderr == "", done.stderr


@pytest.mark.skipif(CLUSTER, reason="starts its own cluster")
def test_a_cluster_without_cluster_true_is_one_line_saying_to_set_it():
    cluster = LocalValkeyCluster(masters=3).start()
    try:
        for args in (("trees",), ("approvals", "list"), ("dead-letters",)):
            line = one_line_error(cli(cluster.url, *args))
            assert "cluster = true" in line and "TREEMAIL_SERVICE_CLUSTER=true" in line, line
    finally:
        cluster.cleanup()


async def test_operators_drain_and_dispose_by_handle_and_sends_are_refused_after(stack, redis_url, calls):
    root = await stack.register_root("planner", "plans", rules={"child": "allow"})
    # One-shot: once disposed, no next incarnation takes a send (a continuable child is resumed by it).
    child = await stack.register_child(root.session_id, "explore", "reads", rules={"parent": "allow"},
                                       continuable=False)
    await stack.start_run(root.session_id, "run-1")

    drained = cli(redis_url, "drain", child.handle)
    assert drained.returncode == 0 and drained.stdout.strip().startswith("1 sessions draining"), drained
    refused = await stack.send_message(calls.ctx(root.session_id), {"to": child.handle, "body": "x"})
    assert refused["error"]["code"] == "send_message:draining"
    lifted = cli(redis_url, "drain", "--lift", child.handle)
    assert lifted.returncode == 0, lifted

    disposed = cli(redis_url, "dispose", child.handle, "--stop-reason", "aborted")
    assert disposed.returncode == 0 and disposed.stdout.startswith(f"disposed {child.session_id}"), disposed
    after = await stack.send_message(calls.ctx(root.session_id), {"to": child.handle, "body": "y"})
    assert after["error"]["code"] == "send_message:recipient_closing"
    assert "no session has id or handle" in one_line_error(cli(redis_url, "dispose", "nobody_00000000"))
    before = await stack.history(root.session_id)
    # Any stop reason a host reports is taken (worded generically); one over its byte limit is refused.
    assert "identifier:too_long" in one_line_error(cli(redis_url, "dispose", root.handle, "--stop-reason", "b" * 65))
    assert await stack.history(root.session_id) == before  # nothing changed


@pytest.mark.parametrize("ref,code", [("x" * 100_000, "identifier:too_long"),
                                      (os.fsdecode(b"planner_\xff"), "identifier:invalid")])
def test_a_session_reference_too_long_or_not_text_is_a_one_line_coded_error_with_a_bounded_echo(redis_url, ref,
                                                                                                  code):
    line = one_line_error(cli(redis_url, "history", ref))
    assert code in line and len(line) < 600


@pytest.mark.parametrize("args,code", [
    (("inspect", "m" * 100_000), "identifier:too_long"),
    (("retry", "m" * 100_000), "identifier:too_long"),
    (("approvals", "approve", "r" * 100_000), "identifier:too_long"),
    (("approvals", "deny", "no-such-request"), "approval:unknown_request"),
    (("inspect", "no-such-message"), "message:unknown"),
    # An empty session (an unset shell variable) is not the whole service's drain.
    (("drain", ""), "identifier:invalid"),
])
def test_an_id_too_long_or_naming_nothing_is_a_one_line_coded_error_with_a_bounded_echo(redis_url, args, code):
    line = one_line_error(cli(redis_url, *args))
    assert code in line and len(line) < 600


async def test_trees_say_how_many_older_sessions_their_members_leave_out(stack, redis_url):
    from treemail.projections.replay import rebuild

    roots = [(await stack.register_root("planner", f"plans {n}")).session_id for n in range(4)]
    await rebuild(adapters(stack).store, list(range(adapters(stack).config.service.partitions)))
    page = cli(redis_url, "trees", "--sessions", "3", "--json")
    assert page.returncode == 0, page.stderr
    assert page.stderr.splitlines() == ["more: 1 older sessions are not among the members; see them with --sessions 4"]
    trees = {t["root_session_id"]: t for t in map(json.loads, page.stdout.splitlines())}  # stdout: JSON lines only
    assert sorted(trees) == sorted(roots)
    assert [root for root, tree in trees.items() if not tree["members"]] == [min(roots)]  # the oldest left out
    whole = cli(redis_url, "trees", "--sessions", "4")
    assert whole.returncode == 0 and whole.stderr == ""


async def test_trees_show_the_listed_sessions_of_a_tree_whose_root_is_older_than_the_listing(stack, redis_url):
    from treemail.projections.replay import rebuild

    root = await stack.register_root("planner", "x", rules={"child": "allow"})
    child = await stack.register_child(root.session_id, "explore", "x", rules={"parent": "allow"})
    grandchild = await stack.register_child(child.session_id, "grep", "x", status="idle")
    await rebuild(adapters(stack).store, list(range(adapters(stack).config.service.partitions)))

    page = cli(redis_url, "trees", "--sessions", "2", "--json")
    (tree,) = [json.loads(line) for line in page.stdout.splitlines()]
    assert (tree["root_session_id"], tree["root_handle"], tree["sessions"]) == (root.session_id, None, 3)
    assert [(m["handle"], m["depth"], m.get("detached", False)) for m in tree["members"]] == [
        (child.handle, 1, True), (grandchild.handle, 2, False)]
    assert page.stderr.splitlines() == ["more: 1 older sessions are not among the members; see them with --sessions 3"]
    lines = cli(redis_url, "trees", "--sessions", "2").stdout.splitlines()
    at = next(n for n, line in enumerate(lines) if line.strip().startswith(root.session_id))
    assert f"  … └ {child.handle}" in lines[at + 1] and f"    └ {grandchild.handle}" in lines[at + 2]


@pytest.mark.parametrize("command", [["mcp", "--http"], ["ui"], ["gateway"]])
def test_a_server_that_cannot_listen_where_it_is_told_is_one_line(redis_url, command):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = str(taken.getsockname()[1])
        assert "cannot listen on 127.0.0.1:" in one_line_error(cli(redis_url, *command, "--port", port))
    # An empty host would listen on every interface, and these servers have no login of their own.
    assert "--host is empty" in one_line_error(cli(redis_url, *command, "--host", "", "--port", "0"))
    assert "cannot listen on no.such.host.invalid:0" in one_line_error(
        cli(redis_url, *command, "--host", "no.such.host.invalid", "--port", "0"))


def test_mcp_over_http_listens_on_an_ipv6_address_and_says_where_in_brackets(redis_url):
    try:
        with socket.socket(socket.AF_INET6) as probe:
            probe.bind(("::1", 0))
    except OSError:
        pytest.skip("this machine has no IPv6 loopback")
    env = {**os.environ, "REDIS_URL": redis_url}
    env.pop("TREEMAIL_CONFIG", None)
    server = subprocess.Popen([sys.executable, "-m", "treemail", "mcp", "--http", "--host", "::1", "--port", "0"],
                              env=env, stderr=subprocess.PIPE, text=True)
    try:
        said = server.stderr.readline()
        assert said.startswith("MCP over streamable HTTP on http://[::1]:"), said
    finally:
        server.terminate()
        server.wait(timeout=30)


@pytest.mark.parametrize("command", [["trees"], ["cluster-plan", "--live"]])
def test_a_redis_url_the_client_does_not_take_is_one_line_naming_it(redis_url, command):
    host, port = redis_url.split("//", 1)[1].split("/", 1)[0].rsplit(":", 1)
    for url in (f"redis://{host}:{port}/0?no_such_option=1", f"http://{host}:{port}", f"redis://{host}:99999"):
        line = one_line_error(cli(url, *command))
        assert "REDIS_URL (or [service] redis_url)" in line and "is not a URL this client takes" in line, url


def test_wrong_credentials_are_said_once_as_such_not_as_a_server_out_of_reach(redis_url):
    host_and_port = redis_url.split("//", 1)[1].split("/", 1)[0]
    line = one_line_error(cli(f"redis://nobody:s3cret@{host_and_port}/0", "trees"))
    assert "refused the credentials" in line and "s3cret" not in line
