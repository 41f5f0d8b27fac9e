"""`[service] host_decides_sends`: a host decides its sends itself, by the decision and the commit script a
worker runs. No worker is running in these tests unless one is named: whatever is decided, the host decided,
and the same guarantees hold (durable before the answer, one message per tool call, the exact live sender,
the inbox cap under a race with a worker)."""

import asyncio

import pytest

from treemail.domain import events as ev
from treemail.host import SendContext, Treemail

from .conftest import make_config, running_stack
from .test_mcp import call, http_client, http_server

pytestmark = pytest.mark.cluster


def deciding(url: str, **messaging):
    config = make_config(url, **messaging)
    return config.model_copy(update={"service": config.service.model_copy(update={"host_decides_sends": True})})


async def tree(host: Treemail):
    root = await host.register_root("planner", "plans", rules={"child": "allow"})
    child = await host.register_child(root.session_id, "explore", "reads", rules={"parent": "allow"})
    await host.start_run(root.session_id, "run-1")
    return root, child


async def accepted(host: Treemail, session_id: str) -> list[ev.ProducerMessageAccepted]:
    return [e for _, e in await host.history(session_id) if isinstance(e, ev.ProducerMessageAccepted)]


async def test_with_no_worker_a_send_is_decided_durable_once_per_tool_call_and_only_from_the_live_run(redis_url):
    host = await Treemail.connect(deciding(redis_url), redis_url)
    try:
        root, child = await tree(host)
        context = SendContext(root.session_id, "run-1", "call-1")
        first = await host.send_message(context, {"to": child.handle, "body": "look at cache.py"})
        assert first["recipient_state"] == "queued"
        (stored,) = await accepted(host, child.session_id)  # in the recipient's stream when answered
        assert (stored.message_id, stored.body) == (first["message_id"], "look at cache.py")

        assert await host.send_message(context, {"to": child.handle, "body": "look at cache.py"}) == first
        conflict = await host.send_message(context, {"to": child.handle, "body": "something else"})
        assert conflict["error"]["code"] == "send_message:idempotency_conflict"
        stale = await host.send_message(SendContext(root.session_id, "run-0", "call-2"),
                                        {"to": child.handle, "body": "from a run that is not open"})
        assert stale["error"]["code"] == "send_message:sender_not_live"
        assert len(await accepted(host, child.session_id)) == 1
    finally:
        await host.close()


async def test_a_deciding_host_racing_a_worker_on_one_recipient_never_passes_its_inbox_cap(redis_url):
    limits = {"max_pending_per_session": 5, "max_inflight_per_pair": 0}
    async with running_stack(redis_url, **limits) as through_worker:
        host = await Treemail.connect(deciding(redis_url, **limits), redis_url)
        try:
            root, child = await tree(host)
            sends = [(h, SendContext(root.session_id, "run-1", f"call-{h is host}-{i}"))
                     for i in range(8) for h in (host, through_worker)]
            results = await asyncio.gather(*(h.send_message(c, {"to": child.handle, "body": c.tool_call_id})
                                             for h, c in sends))
            ok = [r for r in results if "message_id" in r]
            assert len(ok) == 5 and {r["error"]["code"] for r in results if "error" in r} == {
                "send_message:inbox_full"}
            assert sorted(e.message_id for e in await accepted(host, child.session_id)) == sorted(
                r["message_id"] for r in ok)
        finally:
            await host.close()


async def test_an_mcp_send_over_http_is_decided_by_the_server_itself(redis_url):
    host = await Treemail.connect(deciding(redis_url), redis_url)
    try:
        root, child = await tree(host)
        token = await host.tools.mint_token(root.session_id)
        async with http_server(host) as url, http_client(url, token) as client:
            sent = await call(client, {"to": child.handle, "body": "over HTTP"}, call_id="tool-use-1")
            again = await call(client, {"to": child.handle, "body": "over HTTP"}, call_id="tool-use-1")
        assert not sent.is_error and again.structured_content == sent.structured_content
        assert [e.body for e in await accepted(host, child.session_id)] == ["over HTTP"]
    finally:
        await host.close()


class _LostReply:
    """The host's own decider, whose step is appended but whose reply never arrives (a connection lost as the
    commit script answered): the send must go to the workers, who answer it from the same tool call's record."""

    def __init__(self, decider) -> None:
        self.decider = decider
        self.failed = 0

    async def decide(self, commands):
        await self.decider.decide(commands)
        self.failed += 1
        raise ConnectionError("the reply was lost")


async def test_a_send_whose_local_decision_was_appended_but_not_answered_is_answered_by_the_workers_once(
        redis_url):
    async with running_stack(redis_url, config=deciding(redis_url)) as host:
        root, child = await tree(host)
        commands = host._services.commands
        lost = commands._decider = _LostReply(commands._decider)
        context = SendContext(root.session_id, "run-1", "call-1")
        answer = await host.send_message(context, {"to": child.handle, "body": "look at cache.py"})
        assert lost.failed == 1 and "message_id" in answer, answer
        (stored,) = await accepted(host, child.session_id)  # appended once, by the host; told by a worker
        assert stored.message_id == answer["message_id"]
