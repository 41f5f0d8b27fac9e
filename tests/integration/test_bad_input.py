"""Every host API entry point refuses input that is not what it asks for (over long, not text, a lone
surrogate, the wrong type) with one coded error, ``IdentifierError`` (the calls whose answers a tool returns as
is answer a coded error result instead), whose message echoes at most a bounded prefix of the input, and
stores nothing: no directory entry, no stream entry, no index key."""

import pytest

from treemail.adapters import keys
from treemail.domain import limits
from treemail.domain.commands import SendContext
from treemail.domain.errors import TreemailError
from treemail.domain.limits import IdentifierError

from .conftest import adapters, running_stack

pytestmark = pytest.mark.cluster

HUGE = "x" * (4 * 1024 * 1024)
SURROGATE = "plans \ud800 things"
RULES = {"child": "allow", "parent": "allow"}
# A refusal's text is a bounded prefix of the input at most: never the 4 MiB itself.
MAX_ECHO = 1000
# Written by the live processes on their own clock, not by a call: the worker registry, and the command and
# wake streams the workers trim as they acknowledge (a refused host call never reaches them: it is refused
# first; the tree's registration left wake triggers a trim pass may take off at any moment).
VOLATILE = (b"tm:workers", b"tm:cmd:")
VOLATILE_ENDINGS = (b":wakes",)


async def everything(redis) -> dict:
    """Every key with its type and size: what a refused call must leave exactly as it was."""
    out = {}
    for key in await redis.keys("*"):
        if key.startswith(VOLATILE) or key.endswith(VOLATILE_ENDINGS):
            continue
        kind = (await redis.type(key)).decode()
        size = {"stream": redis.xlen, "hash": redis.hlen, "set": redis.scard, "zset": redis.zcard,
                "string": redis.strlen, "list": redis.llen}[kind](key)
        out[key] = (kind, await size)
    return out


def bad_calls(tm, root, child):
    """(what, the call): each must be refused with its code, nothing stored."""
    sid, cid = root.session_id, child.session_id
    return [
        ("route name 4 MiB", lambda: tm.peers.register_route(HUGE, sid, source_agent_type="planner")),
        ("route name not text", lambda: tm.peers.register_route(5, sid, source_agent_type="planner")),
        ("route description surrogate", lambda: tm.peers.register_route("advisor", sid, source_agent_type="p",
                                                                         description=SURROGATE)),
        ("route description 4 MiB", lambda: tm.peers.register_route("advisor", sid, source_agent_type="p",
                                                                     description=HUGE)),
        ("route source 4 MiB", lambda: tm.peers.register_route("advisor", sid, source_agent_type=HUGE)),
        ("route target 4 MiB", lambda: tm.peers.register_route("advisor", HUGE, source_agent_type="p")),
        ("revoke name 4 MiB", lambda: tm.peers.revoke_route(HUGE, source_agent_type="planner")),
        ("grant principal 4 MiB", lambda: tm.peers.set_grant(sid, source_agent_type="p", principal=HUGE)),
        ("grant principal surrogate", lambda: tm.peers.set_grant(sid, source_agent_type="p", principal=SURROGATE)),
        ("grant flag not a bool", lambda: tm.peers.set_grant(sid, source_agent_type="p", send="yes")),
        ("root description surrogate", lambda: tm.register_root("planner", SURROGATE, rules=RULES)),
        ("root description 4 MiB", lambda: tm.register_root("planner", HUGE, rules=RULES)),
        ("root description not text", lambda: tm.register_root("planner", 5, rules=RULES)),
        ("root agent type not text", lambda: tm.register_root(5, "plans", rules=RULES)),
        ("root agent type surrogate", lambda: tm.register_root(SURROGATE, "plans", rules=RULES)),
        ("root rules [1]", lambda: tm.register_root("planner", "plans", rules=[1])),
        ("root rules [(1, 2)]", lambda: tm.register_root("planner", "plans", rules=[(1, 2)])),
        ("root rules pattern 4 MiB", lambda: tm.register_root("planner", "plans", rules={HUGE: "allow"})),
        ("root rules effect 4 MiB", lambda: tm.register_root("planner", "plans", rules={"child": HUGE})),
        ("root rules action 4 MiB", lambda: tm.register_root("planner", "plans", rules={HUGE: {"*": "allow"}})),
        ("root rules surrogate", lambda: tm.register_root("planner", "plans", rules={"*": "allow",
                                                                                    "child\ud800": "deny"})),
        ("root rules many", lambda: tm.register_root("planner", "plans", rules=[("*", "allow")] * 1000)),
        ("root status 4 MiB", lambda: tm.register_root("planner", "plans", rules=RULES, status=HUGE)),
        ("root flag not a bool", lambda: tm.register_root("planner", "plans", rules=RULES, send_message_tool="no")),
        ("child parent 4 MiB", lambda: tm.register_child(HUGE, "explore", "reads", rules=RULES)),
        ("child description surrogate", lambda: tm.register_child(sid, "explore", SURROGATE, rules=RULES)),
        ("child continuable not a bool", lambda: tm.register_child(sid, "explore", "reads", continuable=0)),
        ("inject body not text", lambda: tm.inject(cid, "plugin", 5)),
        ("inject body 4 MiB", lambda: tm.inject(cid, "plugin", HUGE)),
        ("inject body surrogate", lambda: tm.inject(cid, "plugin", SURROGATE)),
        ("inject owner 4 MiB", lambda: tm.inject(cid, HUGE, "hello")),
        ("inject mode 4 MiB", lambda: tm.inject(cid, "plugin", "hello", HUGE)),
        ("inject session 4 MiB", lambda: tm.inject(HUGE, "plugin", "hello")),
        ("status 4 MiB", lambda: tm.set_status(cid, HUGE)),
        ("start run surrogate", lambda: tm.start_run(cid, SURROGATE)),
        ("start run not text", lambda: tm.start_run(cid, 5)),
        ("finish run reason surrogate", lambda: tm.finish_run(sid, "run-1", SURROGATE)),
        ("claim run 4 MiB", lambda: tm.claim(cid, HUGE)),
        ("release reason 4 MiB", lambda: tm.release(cid, "m-1", HUGE)),
        ("discard reason 4 MiB", lambda: tm.discard(cid, "m-1", HUGE)),
        ("dispose reason 4 MiB", lambda: tm.disposal.dispose(cid, HUGE)),
        ("dispose closing text surrogate", lambda: tm.disposal.dispose(cid, "done", SURROGATE)),
        ("stop how 4 MiB", lambda: tm.disposal.stop_subtree(sid, HUGE)),
        ("inspect id 4 MiB", lambda: tm.obligations.inspect(HUGE)),
        ("cancel id 4 MiB", lambda: tm.obligations.cancel(HUGE)),
        ("retry id 4 MiB", lambda: tm.obligations.retry(HUGE)),
        ("approve id 4 MiB", lambda: tm.permissions.approve(HUGE)),
        ("read receipt recipient 4 MiB", lambda: tm.history.read_receipt(sid, HUGE)),
        ("read receipt sender surrogate", lambda: tm.history.read_receipt(SURROGATE, cid)),
        ("search session 4 MiB", lambda: tm.history.search(HUGE, text="x")),
        ("deny id not text", lambda: tm.permissions.deny(5)),
        ("tool call id surrogate", lambda: tm.send_message(SendContext(sid, "run-1", SURROGATE),
                                                           {"to": child.handle, "body": "hi"})),
    ]


async def test_every_host_entry_point_refuses_bad_input_with_its_code_a_bounded_message_and_stores_nothing(
    redis_url,
):
    async with running_stack(redis_url) as tm:
        root = await tm.register_root("planner", "plans", rules=RULES)
        child = await tm.register_child(root.session_id, "explore", "reads", rules=RULES, status="idle")
        await tm.start_run(root.session_id, "run-1")
        redis = adapters(tm).redis
        before = await everything(redis)
        wrong = []
        for what, call in bad_calls(tm, root, child):
            try:
                answer = await call()
            except IdentifierError as error:
                if error.code not in (limits.TOO_LONG, limits.INVALID) or len(str(error)) > MAX_ECHO:
                    wrong.append((what, error.code, str(error)[:200]))
            except Exception as error:  # noqa: BLE001 - any other refusal is what this test catches
                wrong.append((what, type(error).__name__, str(error)[:200]))
            else:
                # The calls that answer a tool as is (inspect, cancel, retry) return their refusal instead.
                error = answer.get("error") if isinstance(answer, dict) else None
                if error is None or len(error["message"]) > MAX_ECHO:
                    wrong.append((what, "accepted", str(answer)[:200]))
            after = await everything(redis)
            if after != before:
                wrong.append((what, "stored", sorted(set(after.items()) ^ set(before.items()))[:4]))
                before = after
        assert wrong == []


async def test_a_tool_result_for_bad_host_input_is_coded_and_bounded_too(redis_url):
    """The model-facing path answers instead of raising: a 4 MiB body or a number is one coded result."""
    async with running_stack(redis_url) as tm:
        root = await tm.register_root("planner", "plans", rules=RULES)
        child = await tm.register_child(root.session_id, "explore", "reads", rules=RULES, status="idle")
        await tm.start_run(root.session_id, "run-1")
        for body in (5, HUGE, SURROGATE, None, ["x"]):
            result = await tm.send_message(SendContext(root.session_id, "run-1", f"c-{type(body).__name__}"),
                                           {"to": child.handle, "body": body})
            assert result["error"]["code"] in ("send_message:invalid_arguments", "send_message:invalid_body")
            assert len(result["error"]["message"]) < MAX_ECHO


async def test_a_required_identifier_given_as_none_and_a_refused_registration_or_fork_store_nothing(redis_url):
    async with running_stack(redis_url) as host:
        root = await host.register_root("planner", "plans", rules={"child": "allow"}, status="running")
        redis = adapters(host).redis
        before = await everything(redis)
        refusals = [
            # None where text is required: a parent of None made a root, a run id of None opened no run.
            (lambda: host.register_child(None, "explore", "reads"), limits.INVALID),
            (lambda: host.register_root("planner", None), limits.INVALID),
            (lambda: host.start_run(root.session_id, None), limits.INVALID),
            # Decided against after the directory entry was written: the entry goes with it.
            (lambda: host.history.fork(root.session_id, 10 ** 6), "lifecycle:invalid_position"),
        ]
        for call, code in refusals:
            with pytest.raises(TreemailError) as refused:
                await call()
            assert getattr(refused.value.code, "value", refused.value.code) == code
        assert sorted(set((await everything(redis)).items()) ^ set(before.items())) == []


async def test_a_grant_to_no_session_and_a_token_lifetime_out_of_range_are_refused_and_store_nothing(redis_url):
    async with running_stack(redis_url) as host:
        advisor = await host.register_root("advisor", "reviews")
        redis = adapters(host).redis
        before = await everything(redis)
        with pytest.raises(TreemailError) as no_such_source:
            await host.peers.set_grant(advisor.session_id, source_session_id="01a20000-0000-7000-8000-000000000000",
                                       send=True)
        assert no_such_source.value.code == "lifecycle:unknown_session"
        for ttl in (0, -5, 3600.0, "5", 10 ** 12, True):
            with pytest.raises(IdentifierError, match="ttl_s must be whole seconds"):
                await host.tools.mint_token(advisor.session_id, ttl_s=ttl)
        assert sorted(set((await everything(redis)).items()) ^ set(before.items())) == []


async def test_a_runners_read_with_a_bad_count_wait_name_or_position_is_refused_before_the_streams(redis_url):
    async with running_stack(redis_url) as host:
        await host.register_root("planner", "plans")
        redis = adapters(host).redis
        before = await everything(redis)
        stream = keys.wake_stream(0)
        reads = [lambda **k: host.wakes(**k), lambda **k: host.interrupts.read(**k)]
        for read in reads:
            for bad in ({"count": 0}, {"count": 10 ** 30}, {"count": True}, {"block_ms": -1}, {"block_ms": 500.0},
                        {"consumer": None}, {"consumer": "x" * 1_000_000}, {"consumer": "\ud800"}):
                with pytest.raises(IdentifierError):
                    await read(**{"consumer": "runner-1", "count": 10, "block_ms": 10, **bad})
        for unacknowledged in (host.obligations.unacknowledged_wakes, host.interrupts.unacknowledged):
            for after in ({stream: "garbage"}, {stream: "99999999999999999999999-0"}, ["x"]):
                with pytest.raises(IdentifierError):
                    await unacknowledged("runner-1", after)
        # Nothing reached the streams: no consumer was kept in any group, no group made.
        assert sorted(set((await everything(redis)).items()) ^ set(before.items())) == []
        for group in await redis.xinfo_groups(stream):
            assert await redis.xinfo_consumers(stream, group["name"]) == []


async def test_a_context_that_is_not_one_is_refused_before_anything_reads_it(redis_url):
    async with running_stack(redis_url) as host:
        redis = adapters(host).redis
        before = await everything(redis)
        calls = [lambda c: host.send_message(c, {"to": "x", "body": "y"}), lambda c: host.peers.send(c, {}),
                 lambda c: host.peers.reply(c, {}), lambda c: host.peers.inbox(c, {}),
                 lambda c: host.tools.call(c, "send_message", {})]
        for call in calls:
            for context in (None, {}, "session"):
                with pytest.raises(IdentifierError, match="context must be a SendContext"):
                    await call(context)
        assert sorted(set((await everything(redis)).items()) ^ set(before.items())) == []
