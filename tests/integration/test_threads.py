"""Threads end to end: answers name what they answer, messages carry a thread id, inspect and
tm.history.thread show the conversation; MCP-only agents thread their replies too."""

import json

import pytest
from mcp import Client

from treemail.domain import events as ev
from treemail.projections import mailboxes
from treemail.projections import timeline as tl

from .conftest import Calls, adapters, running_stack
from .test_search import cli
from .test_mcp import stdio
from .test_mcp_agents import RECEIVE, tree

# Delivery, threads and reads run the same on a 3-master cluster (a tree's keys share one slot).
pytestmark = pytest.mark.cluster

async def test_answers_join_the_thread_and_inspect_shows_the_conversation(redis_url):
    async with running_stack(redis_url, threads=True) as host:
        planner, explore = await tree(host)
        await host.start_run(planner.session_id, "p-run")
        await host.start_run(explore.session_id, "e-run")
        calls = Calls()
        question = await host.send_message(calls.ctx(planner.session_id, "p-run"),
                                           {"to": explore.handle, "body": "which tests fail?"})
        qid = question["message_id"]
        answer = await host.send_message(calls.ctx(explore.session_id, "e-run"),
                                         {"to": planner.handle, "body": "test_cache", "in_reply_to": qid})
        followup = await host.send_message(calls.ctx(planner.session_id, "p-run"),
                                           {"to": explore.handle, "body": "fix it", "in_reply_to": answer["message_id"]})
        other = await host.send_message(calls.ctx(planner.session_id, "p-run"), {"to": explore.handle, "body": "new topic"})

        (accepted,) = [e for _, e in await host.history(planner.session_id) if isinstance(e, ev.ProducerMessageAccepted)]
        assert (accepted.in_reply_to, accepted.thread_id) == (qid, qid)

        thread = await host.history.thread(explore.session_id, followup["message_id"])
        assert [r["message_id"] for r in thread] == [qid, answer["message_id"], followup["message_id"]]
        assert {r["thread_id"] for r in thread} == {qid}
        assert [r["message_id"] for r in await host.history.thread(planner.session_id, other["message_id"])] == [
            other["message_id"]]

        # Only a message the sender received can be answered: an id never reads another's mail.
        stranger = await host.send_message(calls.ctx(planner.session_id, "p-run"),
                                           {"to": explore.handle, "body": "x", "in_reply_to": qid})
        assert stranger["error"]["code"] == "send_message:unknown_reply"

        shown = cli(redis_url, "inspect", answer["message_id"])
        machine = cli(redis_url, "inspect", answer["message_id"], "--json")
        assert shown.returncode == 0, shown.stderr
        assert f"thread {qid} (3 messages)" in shown.stdout
        assert f"* {answer['message_id']}  {explore.handle} -> {planner.handle}  test_cache" in shown.stdout
        assert [r["message_id"] for r in json.loads(machine.stdout)["thread"]] == [
            qid, answer["message_id"], followup["message_id"]]

        # The timeline shows the conversation as a thread, each reply under what it answers, from either side.
        timeline = cli(redis_url, "timeline", explore.handle)
        assert timeline.returncode == 0, timeline.stderr
        assert f"thread {qid[-8:]} (3 messages)" in timeline.stdout
        assert f"\n    ↳ {answer['message_id'][-8:]} {explore.handle} -> {planner.handle}: test_cache\n" in timeline.stdout
        assert f"\n      ↳ {followup['message_id'][-8:]} {planner.handle} -> {explore.handle}: fix it\n" in timeline.stdout
        histories = await mailboxes.with_recipients(
            adapters(host).store, planner.session_id, {planner.session_id: await host.history(planner.session_id)})
        (threaded,) = tl.timeline(planner.session_id, histories).to_json()["threads"]
        assert [(p["message_id"], p["depth"]) for p in threaded["posts"]] == [
            (qid, 0), (answer["message_id"], 1), (followup["message_id"], 2)]


async def test_mcp_only_agents_answer_in_a_thread(redis_url, monkeypatch):
    monkeypatch.setenv("TREEMAIL_MESSAGING_THREADS", "true")
    async with running_stack(redis_url, threads=True) as host:
        planner, explore = await tree(host)
        async with Client(stdio(redis_url, planner.session_id, RECEIVE), cache=None) as a, \
                Client(stdio(redis_url, explore.session_id, RECEIVE), cache=None) as b:
            tools = {t.name: t for t in (await b.list_tools()).tools}
            assert "in_reply_to" in tools["send_message"].input_schema["properties"]
            sent = await a.call_tool("send_message", {"to": explore.handle, "body": "status?"})
            got = await b.call_tool("check_mail", {})
            qid = sent.structured_content["message_id"]
            assert f"(message_id: {qid})" in got.content[0].text  # what the model names to answer it
            replied = await b.call_tool("send_message", {"to": planner.handle, "body": "green", "in_reply_to": qid})
            assert not replied.is_error, replied.content[0].text
        thread = await host.history.thread(planner.session_id, qid)
        assert [r["body"] for r in thread] == ["status?", "green"]
