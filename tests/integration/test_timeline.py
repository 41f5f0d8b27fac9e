"""Mailbox time-travel against a real Valkey: the steps and tokens a host reports are on the streams, the
timeline and the causal chain are rebuilt from what the streams hold, and `treemail timeline` prints them."""

import datetime as dt
import json
import os
import subprocess
import sys

import pytest

from treemail.adapters import keys
from treemail.domain import events as ev
from treemail.domain.errors import UnknownSessionError
from treemail.projections import mailboxes
from treemail.projections import timeline as tl

from .conftest import Calls, adapters, live


async def exchange(host, calls: Calls):
    """The planner asks, the explorer reads it at its step 3 and answers; the planner reads the answer at its
    step 7. Returns the sessions and the two message ids."""
    root = await host.register_root("planner", "x", rules={"child": "allow"})
    child = await host.register_child(root.session_id, "explore", "x", rules={"parent": "allow"}, status="running")
    await live(host, root, child)
    ask = (await host.send_message(calls.ctx(root.session_id), {"to": child.handle, "body": "where is the bug?"}))
    [delivery] = await host.claim(child.session_id, "run-1", step=3)
    await host.consume(child.session_id, delivery.message_id, step=3, tokens=25)
    answer = await host.send_message(calls.ctx(child.session_id), {"to": root.handle, "body": "in cache.py"})
    [back] = await host.claim(root.session_id, "run-1", step=7)
    await host.consume(root.session_id, back.message_id, step=7, tokens=9)
    return root, child, ask["message_id"], answer["message_id"]


@pytest.mark.cluster
async def test_reported_steps_and_tokens_rebuild_each_step_and_the_chain_under_one_trace(stack, calls, exporter):
    exporter.clear()
    root, child, ask, answer = await exchange(stack, calls)

    store = adapters(stack).store
    histories = await mailboxes.histories_for(store, child.session_id, whole_tree=True)
    assert set(histories) == {root.session_id, child.session_id}
    [consumed] = [e for _, e in histories[child.session_id] if isinstance(e, ev.ProducerMessageConsumed)]
    assert (consumed.step, consumed.tokens, consumed.run_id) == (3, 25, "run-1")

    kid = tl.timeline(child.session_id, histories)
    assert [(s.run_id, s.step, s.claimed, s.consumed, s.sent, s.tokens) for r in kid.runs for s in r.steps] == [
        ("run-1", 3, [ask], [ask], [answer], 25)]
    planner = tl.timeline(root.session_id, histories)
    assert [(s.step, s.consumed, s.sent) for r in planner.runs for s in r.steps] == [(0, [], [ask]), (7, [answer], [])]

    chain = tl.causal_chain(answer, histories)
    assert [(link["message"]["message_id"], link["caused_by"]) for link in chain["chain"]] == [
        (answer, [ask]), (ask, [])]
    prepares = [s for s in exporter.get_finished_spans() if s.name == "treemail.prepare"]
    # The answer was caused by the question, so it continues the question's trace: the chain and its trace
    # are one, and the claim spans of both messages (with their steps) are in it.
    trace_ids = {format(s.context.trace_id, "032x") for s in prepares}
    assert trace_ids == {chain["trace_id"]}
    assert [m["message_id"] for m in chain["trace"]] == [ask, answer]
    steps = [s for s in exporter.get_finished_spans() if s.name == "treemail.claim"
             and format(s.context.trace_id, "032x") == tl.timeline(child.session_id, histories).messages[0].trace_id]
    assert [s.attributes.get("treemail.step") for s in steps] == [3, 7]


async def test_the_host_refuses_a_step_or_tokens_that_are_not_counts_and_stores_nothing(stack, calls):
    root = await stack.register_root("planner", "x", rules={"child": "allow"})
    child = await stack.register_child(root.session_id, "explore", "x", status="running")
    await live(stack, root, child)
    await stack.send_message(calls.ctx(root.session_id), {"to": child.handle, "body": "hi"})
    before = await stack.history(child.session_id)
    for bad in (-1, 1.5, "2", True):
        with pytest.raises(ValueError, match="step must be a non-negative integer"):
            await stack.claim(child.session_id, "run-1", step=bad)
    assert await stack.history(child.session_id) == before
    [delivery] = await stack.claim(child.session_id, "run-1")
    with pytest.raises(ValueError, match="tokens must be a non-negative integer"):
        await stack.consume(child.session_id, delivery.message_id, tokens=-3)
    assert not [e for _, e in await stack.history(child.session_id) if isinstance(e, ev.ProducerMessageConsumed)]


def cli(redis_url, *args, timeout=60):
    env = {**os.environ, "REDIS_URL": redis_url}
    return subprocess.run([sys.executable, "-m", "treemail", *args], env=env, capture_output=True, text=True,
                          timeout=timeout)


async def test_timeline_command_prints_the_mailbox_then_and_now_and_json_for_machines(stack, calls, redis_url):
    root, child, ask, answer = await exchange(stack, calls)
    history = await stack.history(child.session_id)
    accepted_at = next(seq for seq, e in history if isinstance(e, ev.ProducerMessageAccepted))

    now = cli(redis_url, "timeline", child.handle)
    assert now.returncode == 0, now.stderr
    assert f"at position {history[-1][0]} of {history[-1][0]}" in now.stdout
    assert "consumed" in now.stdout and ask in now.stdout and "where is the bug?" in now.stdout
    assert ask[-8:] in now.stdout and answer[-8:] in now.stdout  # the step's consumed and sent columns
    # A pending message says why it is pending again, as a parked or returned one says why it is there.
    again = (await stack.send_message(calls.ctx(root.session_id), {"to": child.handle, "body": "and this?"}))
    [delivery] = await stack.claim(child.session_id, "run-1")
    await stack.release(child.session_id, delivery.message_id, "model crashed")
    row = next(line for line in cli(redis_url, "timeline", child.handle).stdout.splitlines()
               if again["message_id"][-12:] in line)
    assert "pending (" in row, row

    machine = json.loads(cli(redis_url, "timeline", child.session_id, "--json", "--at", str(accepted_at)).stdout)
    assert machine["at"] == accepted_at and machine["mailbox"]["pending"] == [ask]
    assert machine["mailbox"]["consumed"] == [] and machine["runs"][0]["steps"] == []
    full = json.loads(cli(redis_url, "timeline", child.session_id, "--json").stdout)
    assert full["mailbox"]["consumed"] == [ask]
    assert full["runs"][0]["steps"][0] | {"first": 0, "last": 0} == {
        "run_id": "run-1", "step": 3, "reported": True, "first": 0, "last": 0, "claimed": [ask], "consumed": [ask],
        "sent": [answer], "tokens": 25, "reverted_by": None, "inherited_from": None}

    # A time: the last position appended at or before it (a microsecond on: ISO 8601 here keeps no finer).
    accepted_time = dict(history)[accepted_at].at
    at = dt.datetime.fromtimestamp(accepted_time + 1e-6, dt.timezone.utc).isoformat()
    by_time = json.loads(cli(redis_url, "timeline", child.session_id, "--json", "--at", at).stdout)
    assert by_time["at"] >= accepted_at and ask in by_time["mailbox"]["pending"] + by_time["mailbox"]["claimed"] + \
        by_time["mailbox"]["consumed"]
    before = cli(redis_url, "timeline", child.session_id, "--json", "--at", "2000-01-01T00:00:00Z")
    assert json.loads(before.stdout)["at"] == 0

    for args, says in ((("--at", "yesterday"), "--at takes a position"), (("--at", "99999"), "is not in the"),
                       (("--at", "²"), "--at takes a position"), (("--at", "٣"), "--at takes a position")):
        bad = cli(redis_url, "timeline", child.session_id, *args)
        assert bad.returncode == 2 and says in bad.stderr and len(bad.stderr.strip().splitlines()) == 1
        assert "Traceback" not in bad.stderr
    missing = cli(redis_url, "timeline", "01a228af-0000-7000-8000-000000000000")
    assert missing.returncode == 2 and "no session has id" in missing.stderr


async def test_a_reverted_run_and_a_fork_read_back_from_the_streams(stack, calls):
    root = await stack.register_root("planner", "x", rules={"child": "allow"})
    child = await stack.register_child(root.session_id, "explore", "x", status="running")
    await live(stack, root, child)
    first = (await stack.send_message(calls.ctx(root.session_id), {"to": child.handle, "body": "one"}))["message_id"]
    [d] = await stack.claim(child.session_id, "run-1", step=1)
    await stack.consume(child.session_id, d.message_id, step=1)
    cut = await stack.history.position(child.session_id)
    second = (await stack.send_message(calls.ctx(root.session_id), {"to": child.handle, "body": "two"}))["message_id"]
    [d] = await stack.claim(child.session_id, "run-1", step=2)
    await stack.consume(child.session_id, d.message_id, step=2)
    fork = await stack.history.fork(child.session_id, cut)
    assert await stack.history.revert(child.session_id, cut) == [second]

    store = adapters(stack).store
    histories = await mailboxes.histories_for(store, fork.session_id)
    assert set(histories) == {fork.session_id, child.session_id}  # the fork's source is read with it
    forked = tl.timeline(fork.session_id, histories)
    assert [(s.step, s.consumed, s.inherited_from) for r in forked.runs for s in r.steps] == [
        (1, [first], child.session_id)]
    reverted = tl.timeline(child.session_id, histories)
    marks = {s.step: s.reverted_by for r in reverted.runs for s in r.steps}
    assert marks[1] is None and marks[2] == reverted.reverts[0]["position"]
    assert {m.message_id: m.state for m in reverted.messages} == {first: "consumed", second: "pending"}


def test_ui_says_in_one_line_when_it_cannot_serve(redis_url):
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        busy = cli(redis_url, "ui", "--port", str(port))
    assert busy.returncode == 2 and busy.stderr.strip() == (
        f"treemail: error: cannot listen on 127.0.0.1:{port}: Address already in use "
        "(--port picks another port, 0 a free one)")
    unreachable = cli("redis://127.0.0.1:1/0", "ui", "--port", "0")
    assert unreachable.returncode == 2 and "cannot reach Redis/Valkey" in unreachable.stderr
    assert len(unreachable.stderr.strip().splitlines()) == 1


@pytest.mark.cluster
async def test_a_history_cache_reads_only_what_was_appended_and_a_stream_behind_it_whole_again(stack, calls):
    root, child, _, _ = await exchange(stack, calls)
    store = adapters(stack).store
    reads: list[tuple[str, int]] = []
    real_read = store.read

    async def counted(record, after=0, count=None):
        reads.append((record.session_id, after))
        return await real_read(record, after, count)

    store.read = counted
    cache = mailboxes.HistoryCache(store)
    whole = await real_read(await adapters(stack).sessions.record(child.session_id))
    assert await cache.read(child.session_id) == whole and reads == [(child.session_id, 0)]
    assert await cache.read(child.session_id) == whole and len(reads) == 1  # nothing new: nothing read

    await stack.send_message(calls.ctx(root.session_id), {"to": child.handle, "body": "and in db.py?"})
    record = await adapters(stack).sessions.record(child.session_id)
    grown = await real_read(record)
    assert await cache.read(child.session_id) == grown and reads[-1] == (child.session_id, whole[-1][0])

    # A server that lost its last writes: the stream and its version behind what was read.
    redis = adapters(stack).redis
    last = grown[-1][0]
    await redis.xdel(keys.session_stream(record.partition, record.session_id), f"{last}-0")
    await redis.hset(keys.session_snapshot(record.partition, record.session_id), "version", last - 1)
    assert await cache.read(child.session_id) == grown[:-1] and reads[-1] == (child.session_id, 0)

    # Bounded in bytes: past its budget the least recently read session is let go (and read whole next time).
    current = await real_read(record)  # the child's history after the loss above
    child_bytes = sum(mailboxes.event_bytes(e) for _, e in current)
    root_bytes = sum(mailboxes.event_bytes(e) for _, e in await real_read(
        await adapters(stack).sessions.record(root.session_id)))
    small = mailboxes.HistoryCache(store, max_bytes=max(child_bytes, root_bytes))  # room for one of them
    await small.read(child.session_id)
    assert child.session_id in small and small.bytes == child_bytes
    await small.read(root.session_id)
    assert child.session_id not in small and root.session_id in small and small.bytes == root_bytes
    reads.clear()
    await small.read(child.session_id)
    assert reads == [(child.session_id, 0)]
    # A session larger than the whole budget is read, and not kept.
    assert await mailboxes.HistoryCache(store, max_bytes=child_bytes - 1).read(child.session_id) == current
    with pytest.raises(UnknownSessionError):
        await cache.read("0190a000-0000-7000-8000-00000000dead")
