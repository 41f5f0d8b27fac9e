"""What a model (or anything else with a pen) can throw at send_message: bounded answers, nothing stored
for a refusal, a deadline for a send waiting on a person, and a reply listener that outlives junk."""

import asyncio
import json

import pytest

from treemail import TreemailError
from treemail.adapters import keys
from treemail.adapters.connection import connect
from treemail.domain.commands import SendArguments
from treemail.domain.limits import MAX_ID_BYTES
from treemail.adapters.commandclient import CommandClient
from treemail.services import approvals

from ..conftest import CLUSTER
from .conftest import adapters, live, make_config, running_stack, timed_stack

pytestmark = pytest.mark.cluster


def code(result):
    return result.get("error", {}).get("code")


def stack_with(url: str, **service):
    config = make_config(url)
    return running_stack(url, config=config.model_copy(update={"service": config.service.model_copy(update=service)}))


async def command_stream_lengths(host) -> int:
    return sum([await adapters(host).redis.xlen(keys.command_stream(i)) for i in range(adapters(host).config.service.command_streams)])


async def test_a_send_waiting_on_a_person_ends_at_its_own_deadline_on_the_hosts_clock(redis_url, calls):
    async with timed_stack(redis_url) as env:  # the host's clock moves only when the test moves it
        host = env.tm
        timeout_s = env.config.service.approval_timeout_s
        root = await host.register_root("planner", "x", rules={"child": "allow"})
        a = await host.register_child(root.session_id, "explore", "a", rules={"sibling": "ask"})
        b = await host.register_child(root.session_id, "review", "b", rules={"sibling": "ask"})
        await live(host, a)  # only a session's open run may send (exact live sender)
        ctx = calls.ctx(a.session_id)
        waiting = asyncio.create_task(host.send_message(ctx, {"to": b.handle, "body": "may I?"}))
        while not await host.permissions.pending_approvals():
            await asyncio.sleep(0.01)
        env.clock.advance(timeout_s - 1)
        await asyncio.sleep(2 * approvals.LOOK_S)  # two looks at the clock: a second short of the deadline
        assert not waiting.done()
        env.clock.advance(1)
        result = await asyncio.wait_for(waiting, 10)
        assert code(result) == "send_message:approval_timeout"
        [request] = await host.permissions.pending_approvals()
        assert request["request_id"] in result["error"]["message"]
        # The request stays open: approved later, the same tool call goes through.
        await host.permissions.approve(request["request_id"])
        again = await asyncio.wait_for(host.send_message(ctx, {"to": b.handle, "body": "may I?"}), 10)
        assert "message_id" in again


async def test_a_send_that_opens_an_approval_request_is_answered_at_once_not_at_a_reclaim(redis_url, calls):
    # Commands are reclaimed only after a minute here: an answer left to a reclaim would miss the deadline.
    async with stack_with(redis_url, reclaim_idle_ms=60_000, decision_timeout_s=5) as host:
        root = await host.register_root("planner", "x", rules={"child": "allow"})
        a = await host.register_child(root.session_id, "explore", "a", rules={"sibling": "ask"})
        b = await host.register_child(root.session_id, "review", "b", rules={"sibling": "ask"})
        await live(host, a)
        waiting = asyncio.create_task(host.send_message(calls.ctx(a.session_id), {"to": b.handle, "body": "may I?"}))
        while not (pending := await host.permissions.pending_approvals()):
            await asyncio.sleep(0.01)
        await host.permissions.approve(pending[0]["request_id"])
        result = await asyncio.wait_for(waiting, 4)
        assert "message_id" in result, result
        # Deciding it again, or a request that never was: each a TreemailError with its code (and the builtin
        # error these calls raised before they had codes).
        with pytest.raises(ValueError) as decided:
            await host.permissions.deny(pending[0]["request_id"])
        assert isinstance(decided.value, TreemailError) and decided.value.code == "approval:already_decided"
        with pytest.raises(LookupError) as unknown:
            await host.permissions.approve("no-such-request")
        assert isinstance(unknown.value, TreemailError) and unknown.value.code == "approval:unknown_request"
        server = adapters(host)
        for index in range(server.config.service.command_streams):
            assert (await server.redis.xpending(keys.command_stream(index), keys.COMMAND_GROUP))["pending"] == 0


async def test_an_oversized_body_is_refused_before_anything_is_stored(stack, calls):
    root = await stack.register_root("planner", "x", rules={"child": "allow"})
    child = await stack.register_child(root.session_id, "explore", "x")
    await live(stack, root)
    before = await command_stream_lengths(stack)
    result = await stack.send_message(calls.ctx(root.session_id), {"to": child.handle, "body": "x" * 10_000_000})
    assert code(result) == "send_message:invalid_body"
    assert "10000000 bytes" in result["error"]["message"]
    assert await command_stream_lengths(stack) == before
    # A body at the limit still goes through the workers.
    limit = adapters(stack).config.messaging.max_body_bytes
    fits = await stack.send_message(calls.ctx(root.session_id), {"to": child.handle, "body": "y" * limit})
    assert "message_id" in fits


async def test_huge_arguments_come_back_as_bounded_errors(stack, calls):
    root = await stack.register_root("planner", "x", rules={"child": "allow"})
    for n in range(60):  # more peers than an error lists
        await stack.register_child(root.session_id, "explore", "d" * 4096)  # the longest description allowed
    await live(stack, root)
    # A `to` longer than any handle or id is refused before it is decided, with a bounded message.
    huge_to = await stack.send_message(calls.ctx(root.session_id), {"to": "z" * 1_000_000, "body": "x"})
    assert code(huge_to) == "send_message:invalid_arguments"
    assert len(huge_to["error"]["message"]) < 500
    # The longest `to` decided names no one: the recipients it could mean are listed, a bounded number.
    longest_to = await stack.send_message(calls.ctx(root.session_id), {"to": "z" * MAX_ID_BYTES, "body": "x"})
    assert code(longest_to) == "send_message:unknown_session"
    assert len(longest_to["error"]["message"]) <= 8192
    assert "unknown subagent reference `zzz" in longest_to["error"]["message"]
    assert "and 20 more" in longest_to["error"]["message"]
    many_keys = {"to": "x", "body": "y", **{f"k{i}": i for i in range(100_000)}}
    unknown = await stack.send_message(calls.ctx(root.session_id), many_keys)
    assert code(unknown) == "send_message:invalid_arguments"
    assert len(unknown["error"]["message"]) < 500
    assert "and 99995 more" in unknown["error"]["message"]


async def test_a_stray_entry_in_the_reply_list_does_not_stop_the_listener(redis_url, calls):
    async with stack_with(redis_url, decision_timeout_s=5) as host:
        root = await host.register_root("planner", "x", rules={"child": "allow"})
        child = await host.register_child(root.session_id, "explore", "x")
        await live(host, root)
        # A command client as the host builds its own, on connections of the test's.
        config = adapters(host).config
        redis, listener = await connect(redis_url, config.service), await connect(redis_url, config.service)
        client = CommandClient(redis, listener, config.service, adapters(host).store.directory)
        try:
            reply_list = keys.reply_list(client.client_id)
            junk = [b"\xff not json", b"[1, 2]", b"42", b'{"no": "command id"}', b'{"command_id": ["x"]}']
            await adapters(host).redis.lpush(reply_list, *junk)
            await asyncio.sleep(0.3)  # the listener has read the junk
            outcome = await client.request(calls.ctx(root.session_id), SendArguments(child.handle, "still heard"))
            assert "message_id" in outcome.get("ok", {}), outcome
        finally:
            await client.close()  # closing does not raise
            await redis.aclose()
            await listener.aclose()



async def test_a_burst_of_answers_is_handed_over_from_the_round_trip_that_waited_for_it(redis_url):
    config = make_config(redis_url)
    redis, listener = await connect(redis_url, config.service), await connect(redis_url, config.service)
    # Every pop the listener makes, and how many answers it returned (a wait that timed out returns none).
    # One server: the client's BLMPOP on its kept connection (``_pop_answers``); a cluster: the listener's calls.
    popped: list[tuple[str, int]] = []

    def count(owner, name: str, label: str) -> None:
        async def counted(*args, _method=getattr(owner, name), **kwargs):
            reply = await _method(*args, **kwargs)
            values = reply[1] if label != "lpop" and reply else reply
            if values:
                popped.append((label, 1 if isinstance(values, bytes) else len(values)))
            return reply
        setattr(owner, name, counted)

    for name in ("blpop", "lpop"):
        count(listener, name, name)
    client = CommandClient(redis, listener, config.service)
    count(client, "_pop_answers", "blmpop")  # before its listener's first pop: that runs at the first await
    try:
        futures = {f"command-{i}": asyncio.get_running_loop().create_future() for i in range(5)}
        client._waiting.update(futures)
        await redis.lpush(keys.reply_list(client.client_id),
                          *[json.dumps({"command_id": c, "ok": {"n": n}}) for n, c in enumerate(futures)])
        answers = await asyncio.wait_for(asyncio.gather(*futures.values()), 5)
        assert answers == [{"ok": {"n": n}} for n in range(5)]
        # One server: one BLMPOP took all five. A cluster: BLPOP the first (handed over at once), LPOP the rest.
        assert popped == ([("blpop", 1), ("lpop", 4)] if CLUSTER else [("blmpop", 5)])
    finally:
        await client.close()
        await redis.aclose()
        await listener.aclose()
