"""The send_message contract, line by line, on a real Valkey: each test names the contract line it proves."""

import json

import pytest

from treemail import PROTOCOL_VERSION
from treemail.adapters import keys
from treemail.adapters.codec import encode_command
from treemail.adapters.compact import decode_record
from treemail.adapters.eventstore import EventStore
from treemail.domain import events as ev
from treemail.domain import protocol
from treemail.domain.commands import SendArguments, SendContext, SendMessage
from treemail.domain.decide import guards, idempotency
from treemail.domain.state import fold
from treemail.projections.replay import rebuild
from treemail.services.sends import SendService

from .conftest import adapters, live, running_stack

pytestmark = pytest.mark.cluster


def code(result):
    return result.get("error", {}).get("code")


async def family(host, status="running"):
    root = await host.register_root("planner", "plans the work", rules={"child": "allow", "*": "allow"})
    a = await host.register_child(root.session_id, "explore", "reads code", rules={"parent": "allow"}, status=status)
    await live(host, root)  # only a session's open run may send (exact live sender)
    return root, a


async def accepted_events(host, session_id):
    return [e for _, e in await host.history(session_id) if isinstance(e, ev.ProducerMessageAccepted)]


# ---- "send_message:invalid_body — empty" (blank is empty), before resolution and the master switch ----


async def test_invalid_body_blank_fails_before_resolution_and_before_the_master_switch(redis_url, calls):
    async with running_stack(redis_url, enabled=False) as host:
        root, a = await family(host)
        for to in (a.handle, "nobody_00000000", "0190a000-0000-7000-8000-00000000dead"):
            result = await host.send_message(calls.ctx(root.session_id), {"to": to, "body": " \n\t "})
            assert code(result) == "send_message:invalid_body", to
        assert await accepted_events(host, a.session_id) == []


# ---- "recipient_state — ... queued" for an idle recipient, which is still woken ---------------


async def test_recipient_state_idle_reports_queued_and_the_recipient_is_woken(stack, calls):
    root, a = await family(stack, status="idle")
    result = await stack.send_message(calls.ctx(root.session_id), {"to": a.handle, "body": "wake up"})
    assert result["recipient_state"] == "queued"
    [wake] = await stack.wakes("runner-1", block_ms=2000)
    assert wake.session_id == a.session_id and wake.message_id == result["message_id"]


# ---- "a self-repairing candidate list ... handle — description — status (session_id <uuid>)" ----


def counting(redis):
    """Count round trips: single commands and pipelines alike."""
    counts = {"trips": 0}
    execute, pipeline = redis.execute_command, redis.pipeline

    async def counted_execute(*args, **kwargs):
        counts["trips"] += 1
        return await execute(*args, **kwargs)

    def counted_pipeline(*args, **kwargs):
        counts["trips"] += 1
        return pipeline(*args, **kwargs)

    redis.execute_command, redis.pipeline = counted_execute, counted_pipeline
    return counts


async def test_candidate_list_is_sorted_by_handle_bounded_and_built_in_one_round_trip(stack, calls):
    root = await stack.register_root("planner", "plans", rules={"child": "allow"})
    extra = 20
    children = [
        await stack.register_child(root.session_id, f"t{i % 7}", "" if i % 2 else f"child {i}")
        for i in range(guards.CANDIDATE_LIMIT + extra)
    ]
    await live(stack, root)
    result = await stack.send_message(calls.ctx(root.session_id), {"to": "nobody_00000000", "body": "x"})
    assert code(result) == "send_message:unknown_session"
    rows = result["error"]["message"].splitlines()[1:]
    handles = sorted(c.handle for c in children)
    assert [row.split(" — ")[0] for row in rows[:-1]] == [f"- {h}" for h in handles[: guards.CANDIDATE_LIMIT]]
    assert rows[-1] == f"- … and {extra} more not listed"
    undescribed = next(c for i, c in enumerate(children) if i % 2 and c.handle in handles[: guards.CANDIDATE_LIMIT])
    agent_type = undescribed.handle.rsplit("_", 1)[0]
    assert f"- {undescribed.handle} — {agent_type} — queued (session_id {undescribed.session_id})" in rows

    # one round trip, however large the tree
    store = EventStore(adapters(stack).redis, adapters(stack).config.service)
    service = SendService(store, adapters(stack).config.messaging)
    record = await adapters(stack).sessions.record(root.session_id)
    counts = counting(adapters(stack).redis)
    try:
        peers = await service._peers(record)
    finally:
        del adapters(stack).redis.execute_command, adapters(stack).redis.pipeline
    assert counts["trips"] == 1 and len(peers) == len(children)


async def test_candidate_list_says_none_when_the_sender_is_alone(stack, calls):
    root = await stack.register_root("planner", "alone", rules={"child": "allow"})
    await live(stack, root)
    result = await stack.send_message(calls.ctx(root.session_id), {"to": "nobody_00000000", "body": "x"})
    assert result["error"]["message"].splitlines()[1:] == ["- (none)"]


# ---- "a retried tool call returns the original message_id" whatever changed since ---------------


async def test_retry_returns_the_original_outcome_after_messaging_was_disabled(redis_url, calls):
    async with running_stack(redis_url) as host:
        root, a = await family(host)
        ctx = calls.ctx(root.session_id)
        first = await host.send_message(ctx, {"to": a.handle, "body": "once"})
    async with running_stack(redis_url, enabled=False) as host:
        assert await host.send_message(ctx, {"to": a.handle, "body": "once"}) == first
        assert code(await host.send_message(calls.ctx(root.session_id), {"to": a.handle, "body": "new"})) == (
            "send_message:disabled")
        assert len(await accepted_events(host, a.session_id)) == 1


async def test_retry_returns_the_original_outcome_after_the_inbox_filled_and_the_run_finished(redis_url, calls):
    async with running_stack(redis_url, max_pending_per_session=2, max_inflight_per_pair=0) as host:
        root, a = await family(host)
        b = await host.register_child(root.session_id, "review", "b", rules={"sibling": "allow"})
        await live(host, b)
        ctx = calls.ctx(root.session_id, "run-1")
        first = await host.send_message(ctx, {"to": a.handle, "body": "first"})
        assert "message_id" in first
        await host.send_message(calls.ctx(b.session_id), {"to": a.handle, "body": "fills it"})
        assert code(await host.send_message(calls.ctx(b.session_id), {"to": a.handle, "body": "x"})) == (
            "send_message:inbox_full")
        assert await host.send_message(ctx, {"to": a.handle, "body": "first"}) == first
        await host.finish_run(root.session_id, "run-1")
        assert await host.send_message(ctx, {"to": a.handle, "body": "first"}) == first
        assert len(await accepted_events(host, a.session_id)) == 2


async def test_retry_of_a_refusal_returns_the_refusal_after_the_setting_changed(redis_url, calls):
    async with running_stack(redis_url, enabled=False) as host:
        root, a = await family(host)
        ctx = calls.ctx(root.session_id)
        refused = await host.send_message(ctx, {"to": a.handle, "body": "x"})
        assert code(refused) == "send_message:disabled"
    async with running_stack(redis_url) as host:
        assert await host.send_message(ctx, {"to": a.handle, "body": "x"}) == refused
        assert await accepted_events(host, a.session_id) == []


async def test_idempotency_evidence_lives_with_the_senders_session_without_expiry(stack, calls):
    root, a = await family(stack)
    ctx = calls.ctx(root.session_id)
    await stack.send_message(ctx, {"to": a.handle, "body": "kept"})
    record = await adapters(stack).sessions.record(root.session_id)
    key = keys.session_idempotency(record.partition, root.session_id)
    assert await adapters(stack).redis.hlen(key) == 1
    assert await adapters(stack).redis.ttl(key) == -1  # no expiry: it goes only with the session's keys


async def test_an_accepted_calls_record_is_kept_short_and_a_record_written_as_an_object_still_answers(stack, calls):
    root, a = await family(stack)
    ctx = calls.ctx(root.session_id)
    first = await stack.send_message(ctx, {"to": a.handle, "body": "kept"})
    record = await adapters(stack).sessions.record(root.session_id)
    key = keys.session_idempotency(record.partition, root.session_id)
    [(field, raw)] = (await adapters(stack).redis.hgetall(key)).items()
    assert field == bytes.fromhex(idempotency.key_digest(ctx)) and len(raw) == 44  # the ids' bytes in base64url
    fp, *outcome = decode_record(raw)
    assert outcome == [first["message_id"], first["mode"], first["recipient_state"]]
    # Written by an earlier version: an object, under the digest's text. A retry gets the same outcome, a
    # changed body a conflict.
    await adapters(stack).redis.hdel(key, field)
    old_object = json.dumps({"fp": fp, "outcome": {"ok": first}})
    await adapters(stack).redis.hset(key, idempotency.key_digest(ctx), old_object)
    assert await stack.send_message(ctx, {"to": a.handle, "body": "kept"}) == first
    assert code(await stack.send_message(ctx, {"to": a.handle, "body": "changed"})) == "send_message:idempotency_conflict"
    assert len(await accepted_events(stack, a.session_id)) == 1


# ---- effective permissions: the host's session overlay, recorded as events ----------------------


async def test_a_session_overlay_is_an_event_that_sends_tool_visibility_and_replay_follow(stack, calls):
    root, a = await family(stack)
    assert (await stack.tool_definition(a.session_id))["name"] == "send_message"
    await live(stack, a)
    await stack.permissions.set_message_rules(a.session_id, {"parent": "deny"})
    assert await stack.tool_definition(a.session_id) is None
    assert code(await stack.send_message(calls.ctx(a.session_id), {"to": root.handle, "body": "x"})) == (
        "permission_denied")
    report = await stack.permissions.effective(a.session_id)
    assert report["tool"]["visible"] is False
    assert report["labels"]["parent"] == {"effect": "deny", "source": "overlay", "rule": "parent",
                                          "decided_by": "overlay rule 'parent': deny", "sessions": [root.handle]}
    await stack.permissions.set_message_rules(a.session_id, None)
    assert "message_id" in await stack.send_message(calls.ctx(a.session_id), {"to": root.handle, "body": "y"})
    history = [e for _, e in await stack.history(a.session_id)]
    assert [e.rules for e in history if isinstance(e, ev.MessageRulesOverlaid)] == [[("parent", "deny")], []]
    record = await adapters(stack).sessions.record(a.session_id)
    assert fold(history) == (await adapters(stack).store.load(record)).state  # replay gives what live decided on


async def test_the_reply_hint_follows_the_recipients_overlay(stack, calls):
    root, a = await family(stack)
    await stack.permissions.set_message_rules(a.session_id, {"*": "deny"})
    await stack.send_message(calls.ctx(root.session_id), {"to": a.handle, "body": "hello"})
    await stack.start_run(a.session_id, "run-a")
    [delivery] = await stack.claim(a.session_id, "run-a")
    assert "[use `send_message" not in delivery.text


# ---- what the model reads ----------------------------------------------------------------------


async def test_the_host_returns_the_model_facing_text_beside_the_structured_result(stack, calls):
    root, a = await family(stack)
    ok = await stack.send_message_for_model(calls.ctx(root.session_id), {"to": a.handle, "body": "hi"})
    assert not ok.is_error and ok.text.startswith(f"send_message accepted: message_id={ok.result['message_id']}")
    err = await stack.send_message_for_model(calls.ctx(root.session_id), {"to": root.handle, "body": "hi"})
    assert err.is_error and err.text == f"send_message:self_send: {err.result['error']['message']}"


# ---- a versioned protocol ------------------------------------------------------------------------


async def test_every_stream_entry_and_command_carries_the_protocol_version(stack, calls):
    root, a = await family(stack, status="finished")
    await stack.send_message(calls.ctx(root.session_id), {"to": a.handle, "body": "wake"})
    record = await adapters(stack).sessions.record(a.session_id)
    p = record.partition
    session_entries = await adapters(stack).redis.xrange(keys.session_stream(p, a.session_id))
    feed_entries = await adapters(stack).redis.xrange(keys.feed(p))
    wake_entries = await adapters(stack).redis.xrange(keys.wake_stream(p))
    assert session_entries and feed_entries and wake_entries
    for _, fields in [*session_entries, *feed_entries, *wake_entries]:
        assert fields[b"v"] == str(PROTOCOL_VERSION).encode()
    commands = [f for i in range(adapters(stack).config.service.command_streams)
                for _, f in await adapters(stack).redis.xrange(keys.command_stream(i))]
    assert commands and all(json.loads(f[b"__data__"])["v"] == PROTOCOL_VERSION for f in commands)


async def test_a_worker_dead_letters_a_command_from_a_newer_protocol_and_tells_its_producer(stack):
    command = SendMessage("cmd-newer", SendContext("s", "r", "t"), SendArguments("explore_00000001", "x"), "probe")
    data = {**json.loads(encode_command(command)), "v": PROTOCOL_VERSION + 1}
    await adapters(stack).redis.xadd(keys.command_stream(0), {"__data__": json.dumps(data)})
    answer = await adapters(stack).redis.blpop([keys.reply_list("probe")], timeout=10)
    assert answer is not None
    reply = json.loads(answer[1])
    assert reply["command_id"] == "cmd-newer" and reply["error"]["code"] == "send_message:engine_shutdown"
    assert f"protocol {PROTOCOL_VERSION + 1}" in reply["error"]["message"] and "upgrade" in reply["error"]["message"]
    letters = [{k.decode(): v.decode() for k, v in f.items()} for _, f in await adapters(stack).redis.xrange(keys.dead_letters())]
    assert [d["reason"] for d in letters] == ["newer_protocol"]


async def test_readers_refuse_or_skip_a_stream_entry_from_a_newer_protocol(stack, calls):
    root, a = await family(stack)
    record = await adapters(stack).sessions.record(a.session_id)
    loaded = await adapters(stack).store.load(record)
    name, payload = ev.encode(ev.SessionRunStarted(run_id="from-the-future"))
    await adapters(stack).redis.xadd(keys.session_stream(record.partition, a.session_id),
                           {"type": name, "data": payload, "v": PROTOCOL_VERSION + 1}, id=f"{loaded.version + 1}-0")
    with pytest.raises(protocol.NewerProtocol, match="upgrade it"):
        await stack.history(a.session_id)
    raw = await adapters(stack).store.read_raw(record)
    assert raw[-1] == (loaded.version + 1, None)  # folds and replay skip it
    views = await rebuild(adapters(stack).store, [record.partition], write=False)
    assert views  # the rebuild went past it


async def test_a_projection_skips_and_reports_a_feed_entry_from_a_newer_protocol(stack, calls, caplog):
    from treemail.projections.runner import ProjectionRunner

    root, a = await family(stack)
    record = await adapters(stack).sessions.record(a.session_id)
    runner = ProjectionRunner(EventStore(adapters(stack).redis, adapters(stack).config.service), adapters(stack).config,
                              partitions=[record.partition])
    await runner.start()
    await stack.send_message(calls.ctx(root.session_id), {"to": a.handle, "body": "counted"})
    # what a newer writer would append next, as the feed carries it
    name, payload = ev.encode(ev.ProducerMessageAccepted(
        message_id="m-future", producer_id="agent:x", owner="agent", sender_session_id=root.session_id,
        body="b", mode="steer"))
    version = (await adapters(stack).store.load(record)).version
    await adapters(stack).redis.xadd(keys.feed(record.partition), {"session": a.session_id, "seq": str(version + 1),
                                                         "type": name, "data": payload, "v": PROTOCOL_VERSION + 1})
    while await runner.step(block_ms=50):
        pass
    inbox = dict(runner.views[("inbox", record.partition)])
    assert inbox[a.session_id] == "1"  # the newer entry was not folded, the current one was
    assert f"written by treemail protocol {PROTOCOL_VERSION + 1}" in caplog.text
