"""Plugins observe and gate, on a real Valkey: the mail-event subscription and the pre-send hook."""

import asyncio

import pytest

from treemail.adapters import keys
from treemail.domain import events as ev
from treemail.domain.decide import idempotency
from treemail.host import SendAttempt, SubscriptionGap

from .conftest import adapters, close_host, connect_host, live, make_config

pytestmark = pytest.mark.cluster


async def collect(host, count, after=None, types=..., timeout=10.0):
    """The first ``count`` observations of a subscription (fails on timeout rather than hang)."""
    out = []
    kwargs = {} if types is ... else {"types": types}

    async def run():
        async for observed in host.history.subscribe(after, block_ms=100, **kwargs):
            out.append(observed)
            if len(out) == count:
                return

    await asyncio.wait_for(run(), timeout)
    return out


async def two_trees(host):
    trees = []
    for name in ("planner", "auditor"):
        root = await host.register_root(name, "x", rules={"*": "allow"}, status="running")
        child = await host.register_child(root.session_id, "explore", "x", rules={"*": "allow"}, status="running")
        await live(host, root)  # only a session's open run may send (exact live sender)
        trees.append((root, child))
    return trees


def mail_steps(history):
    return [e for _, e in history if type(e).__name__.startswith(("ProducerMessage", "ProducerRegistered"))]


# ---- observe ---------------------------------------------------------------------------------------


async def test_a_subscription_yields_every_sessions_mail_events_live(stack, calls):
    trees = await two_trees(stack)
    now = await stack.history.subscription_position()
    watcher = asyncio.ensure_future(collect(stack, 8, after=now))
    sent = []
    for root, child in trees:
        await stack.start_run(child.session_id, "run-1")
        sent.append(await stack.send_message(calls.ctx(root.session_id), {"to": child.handle, "body": "go"}))
        [delivery] = await stack.claim(child.session_id, "run-1")
        await stack.consume(child.session_id, delivery.message_id)

    observed = await watcher

    kinds = [(o.session_id, type(o.event).__name__) for o in observed]
    for (_, child), result in zip(trees, sent):
        assert [k for s, k in kinds if s == child.session_id] == [
            "ProducerRegistered", "ProducerMessageAccepted", "ProducerMessageClaimed", "ProducerMessageConsumed",
        ]
        accepted = [o.event for o in observed if isinstance(o.event, ev.ProducerMessageAccepted)
                    and o.session_id == child.session_id]
        assert accepted[0].message_id == result["message_id"]
    # Run starts and admissions are not mail traffic; every event type is there for whoever asks.
    everything = await collect(stack, 1, after=now, types=None)
    assert isinstance(everything[0].event, ev.SessionRunStarted)


async def test_a_subscription_resumes_after_any_yielded_position_without_gaps_or_repeats(stack, calls):
    trees = await two_trees(stack)
    await live(stack, *(child for _, child in trees))  # the children answer from their open runs
    for i in range(3):
        for root, child in trees:
            await stack.send_message(calls.ctx(root.session_id), {"to": child.handle, "body": f"{i}"})
            await stack.send_message(calls.ctx(child.session_id), {"to": root.handle, "body": f"{i}"})
    total = 0
    for session in (s for pair in trees for s in pair):
        total += len(mail_steps(await stack.history(session.session_id)))

    everything = await collect(stack, total, after="start")

    assert len({(o.session_id, o.event) for o in everything}) == total
    # A feed entry names a whole step: the first send's step registers the producer and accepts the message,
    # so the first position falls between two events of one entry.
    assert any(part.count("/") == 2 for part in everything[0].position.split(","))
    for cut in (0, 5, total - 2):
        rest = await collect(stack, total - cut - 1, after=everything[cut].position)
        assert [(o.session_id, o.event) for o in rest] == [(o.session_id, o.event) for o in everything[cut + 1:]]


async def test_resuming_from_a_position_the_trimmed_feed_no_longer_holds_raises_a_gap(redis_url):
    base = make_config(redis_url)
    config = base.model_copy(update={"service": base.service.model_copy(update={"feed_maxlen": 100,
                                                                                   "partitions": 1})})
    host = await connect_host(config, redis_url)
    try:
        busy = await host.register_root("planner", "busy", status="running")
        early = await host.history.subscription_position()
        await host.inject(busy.session_id, "plugin", "first")
        for i in range(400):
            await host.inject(busy.session_id, "plugin", f"{i}")
        with pytest.raises(SubscriptionGap):
            await collect(host, 1, after=early)
        assert await collect(host, 1, after="start")  # the oldest retained events are still there
    finally:
        await close_host(host)


async def test_a_live_subscription_the_trim_passes_raises_a_gap_rather_than_skip_events(redis_url):
    base = make_config(redis_url)
    config = base.model_copy(update={"service": base.service.model_copy(update={"partitions": 1})})
    host = await connect_host(config, redis_url)
    try:
        busy = await host.register_root("planner", "busy", status="running")
        live_feed = host.history.subscribe(await host.history.subscription_position(), types=None, block_ms=100)
        await host.inject(busy.session_id, "plugin", "first")
        first = await asyncio.wait_for(live_feed.__anext__(), 10)
        assert first.session_id == busy.session_id
        for i in range(7):
            await host.inject(busy.session_id, "plugin", f"{i}")
        # The subscriber is slow: the feed is trimmed past what it has read before it reads on.
        await adapters(host).redis.xtrim(keys.feed(0), maxlen=2, approximate=False)
        seen = [first]
        with pytest.raises(SubscriptionGap):
            while len(seen) < 20:  # the rest of the batch it holds, then the next read
                seen.append(await asyncio.wait_for(live_feed.__anext__(), 10))
        assert {getattr(o.event, "body", "first") for o in seen} == {"first"}  # nothing after the gap
    finally:
        await close_host(host)


async def test_a_subscription_asked_for_wrongly_is_refused_when_it_is_asked_for(stack):
    from treemail.domain.limits import IdentifierError

    for bad in ({"after": 5}, {"types": "ProducerMessageAccepted"}, {"types": ["Nope"]}, {"types": 5},
                {"block_ms": None}, {"block_ms": -1}, {"block_ms": 1.5}, {"block_ms": True}):
        with pytest.raises(IdentifierError):
            stack.history.subscribe(**bad)  # never a read: None would poll the feeds without pause
    with pytest.raises(IdentifierError, match="not a subscription position"):
        await stack.history.subscribe("garbage").__anext__()


# ---- gate ------------------------------------------------------------------------------------------


async def pair(host):
    root = await host.register_root("planner", "x", rules={"*": "allow"}, status="running")
    child = await host.register_child(root.session_id, "explore", "x", rules={"*": "allow"}, status="running")
    await live(host, root)
    return root, child


async def test_a_send_hook_refuses_with_its_reason_and_the_refusal_leaves_no_trace(stack, calls):
    root, child = await pair(stack)
    remove = stack.permissions.add_send_hook(lambda attempt: "no secrets in mail" if "secret" in attempt.body else None)
    before = await stack.history(child.session_id)
    context = calls.ctx(root.session_id)

    refused = await stack.send_message(context, {"to": child.handle, "body": "the secret is 42"})

    assert refused == {"error": {"code": "send_message:plugin_refused", "message": "no secrets in mail"}}
    assert await stack.history(child.session_id) == before and await stack.obligations.pending_mail(child.session_id) == []
    record = await adapters(stack).sessions.record(root.session_id)
    recorded = keys.session_idempotency(record.partition, record.session_id)
    digest = idempotency.key_digest(context)
    assert await adapters(stack).redis.hmget(recorded, [bytes.fromhex(digest), digest]) == [None, None]
    # The same tool call again: asked again, refused the same way; once the hook is gone it is decided afresh.
    assert await stack.send_message(context, {"to": child.handle, "body": "the secret is 42"}) == refused
    allowed = await stack.send_message(calls.ctx(root.session_id), {"to": child.handle, "body": "hello"})
    assert "message_id" in allowed
    remove()
    retried = await stack.send_message(context, {"to": child.handle, "body": "the secret is 42"})
    assert "message_id" in retried


async def test_a_retried_call_accepted_before_a_hook_refused_returns_its_original_message_id(stack, calls):
    root, child = await pair(stack)
    context = calls.ctx(root.session_id)
    first = await stack.send_message(context, {"to": child.handle, "body": "hello"})
    stack.permissions.add_send_hook(lambda attempt: "mail is closed")

    retried = await stack.send_message(context, {"to": child.handle, "body": "hello"})

    assert retried == first
    assert [m.message_id for m in await stack.obligations.pending_mail(child.session_id)] == [first["message_id"]]
    fresh = await stack.send_message(calls.ctx(root.session_id), {"to": child.handle, "body": "hello"})
    assert fresh["error"]["code"] == "send_message:plugin_refused"


async def test_a_send_hook_sees_the_context_and_strict_arguments_and_may_be_async(stack, calls):
    root, child = await pair(stack)
    seen: list[SendAttempt] = []

    async def audit(attempt: SendAttempt):
        seen.append(attempt)
        return None

    stack.permissions.add_send_hook(audit)
    context = calls.ctx(root.session_id)
    assert "message_id" in await stack.send_message(context, {"to": child.handle, "body": "hi", "mode": "queue"})
    bad = await stack.send_message(calls.ctx(root.session_id), {"to": child.handle, "bdy": "typo"})

    assert seen == [SendAttempt(context, child.handle, "hi", "queue")]  # invalid arguments never reach a hook
    assert bad["error"]["code"] == "send_message:invalid_arguments"


async def test_a_send_hook_that_raises_refuses_the_send(stack, calls):
    root, child = await pair(stack)

    def broken(attempt):
        raise RuntimeError("audit log unavailable")

    stack.permissions.add_send_hook(broken)
    result = await stack.send_message(calls.ctx(root.session_id), {"to": child.handle, "body": "hi"})
    assert result["error"]["code"] == "send_message:plugin_refused"
    assert "RuntimeError" in result["error"]["message"]
    assert await stack.obligations.pending_mail(child.session_id) == []


async def test_a_refused_send_is_answered_by_the_host_without_publishing_a_command(redis_url, calls):
    """No worker runs here: a refused send is answered at once because it was never published."""
    host = await connect_host(make_config(redis_url), redis_url)
    try:
        root, child = await pair(host)
        host.permissions.add_send_hook(lambda attempt: "not now")
        length = sum([await adapters(host).redis.xlen(keys.command_stream(i)) for i in range(2)])
        result = await asyncio.wait_for(host.send_message(calls.ctx(root.session_id), {"to": child.handle,
                                                                                        "body": "x"}), 2)
        assert result["error"] == {"code": "send_message:plugin_refused", "message": "not now"}
        assert sum([await adapters(host).redis.xlen(keys.command_stream(i)) for i in range(2)]) == length
    finally:
        await close_host(host)
