"""Peer routes through the real stack: two independent trees, grants, replies, proofs.

Every test here runs with a proof keyring on the host and the worker, as a
deployment that turns proofs on does.
"""

import json

import pytest

from treemail import TreemailError
from treemail.adapters import keys
from treemail.adapters.metrics import HOST_REGISTRY as REGISTRY
from treemail.adapters.proofkeys import ProofConfig
from treemail.domain import events as ev

from .conftest import adapters, live, make_config, running_stack

pytestmark = pytest.mark.cluster

KEYRING = ProofConfig(keys={"k1": "first-secret-of-32-characters-00"})
QUESTION = {"type": "object", "properties": {"question": {"type": "string"}}, "required": ["question"],
            "additionalProperties": False}


def proven_stack(url: str, proof: ProofConfig = KEYRING):
    return running_stack(url, config=make_config(url).model_copy(update={"proof": proof}))


@pytest.fixture
async def host(redis_url):
    async with proven_stack(redis_url) as host:
        yield host


async def independent_trees(host):
    """A planner and an advisor, each the root of its own tree, in different partitions (so different slots)."""
    planner = await host.register_root("planner", "plans the work", rules={})
    for _ in range(50):
        advisor = await host.register_root("advisor", "reviews designs", rules={}, status="idle")
        partitions = adapters(host).config.service.partitions
        if keys.partition_of(advisor.root_session_id, partitions) != keys.partition_of(planner.root_session_id,
                                                                                       partitions):
            await live(host, planner)  # only a session's open run may send (exact live sender)
            return planner, advisor
    raise AssertionError("no two partitions")


async def route(host, source, target, name, **grant):
    await host.peers.register_route(name, target.session_id, source_session_id=source.session_id)
    if grant:
        await host.peers.set_grant(target.session_id, source_session_id=source.session_id, **grant)


async def of_type(host, session_id, cls):
    return [e for _, e in await host.history(session_id) if isinstance(e, cls)]


async def deliveries(host, session_id, run_id="run-a"):
    await host.start_run(session_id, run_id)
    return await host.claim(session_id, run_id)


def failures(reason: str) -> float:
    return REGISTRY.get_sample_value("treemail_source_proof_failures_total", {"reason": reason}) or 0.0


async def test_a_message_crosses_to_another_tree_over_a_route_with_its_principal_and_a_verified_proof(host, calls):
    planner, advisor = await independent_trees(host)
    await route(host, planner, advisor, "advisor", send=True, context=True, principal="acme/planning")

    result = await host.peers.send(calls.ctx(planner.session_id), {"peer": "advisor", "body": "review cache.py"})
    assert set(result) == {"message_id", "peer", "mode", "status"}, result  # no read grant: the target's state stays hidden

    [delivery] = await deliveries(host, advisor.session_id)
    assert (delivery.message_id, delivery.principal, delivery.verified) == (result["message_id"], "acme/planning",
                                                                           True)
    assert delivery.text.startswith(f'<agent_message from="{planner.handle}" via="peer" principal="acme/planning"')
    assert "review cache.py" in delivery.text and "reply_to_peer" not in delivery.text  # no route back
    [accepted] = await of_type(host, advisor.session_id, ev.ProducerMessageAccepted)
    assert (accepted.sender_session_id, accepted.return_address, accepted.peer) == (
        planner.session_id, planner.session_id, "advisor")
    assert accepted.proof["key_id"] == "k1" and accepted.body == "review cache.py"
    # The route and the grant are in the target's history, as events.
    assert [type(e) for e in await of_type(host, advisor.session_id, (ev.PeerRouteRegistered, ev.PeerGrantSet))] == [
        ev.PeerRouteRegistered, ev.PeerGrantSet]


async def test_routes_and_grants_deny_by_default_and_revoking_a_route_refuses_the_next_send(host, calls):
    planner, advisor = await independent_trees(host)
    assert await host.peers.send_tool_definition(planner.session_id) is None
    result = await host.peers.send(calls.ctx(planner.session_id), {"peer": "advisor", "body": "hi"})
    assert result["error"]["code"] == "peer_message:unknown_peer"

    await route(host, planner, advisor, "advisor")  # a route, but no grant
    assert await host.peers.send_tool_definition(planner.session_id) is None
    result = await host.peers.send(calls.ctx(planner.session_id), {"peer": "advisor", "body": "hi"})
    assert result["error"]["code"] == "peer_message:not_granted"

    await host.peers.set_grant(advisor.session_id, source_session_id=planner.session_id, send=True)
    assert "message_id" in await host.peers.send(calls.ctx(planner.session_id), {"peer": "advisor", "body": "hi"})
    assert await host.peers.revoke_route("advisor", source_session_id=planner.session_id) is True
    result = await host.peers.send(calls.ctx(planner.session_id), {"peer": "advisor", "body": "again"})
    assert result["error"]["code"] == "peer_message:unknown_peer"
    assert len(await of_type(host, advisor.session_id, ev.ProducerMessageAccepted)) == 1


async def test_receiving_grants_nothing_back_and_a_reply_needs_its_own_route_and_a_real_reference(host, calls):
    planner, advisor = await independent_trees(host)
    await route(host, planner, advisor, "advisor", send=True)
    sent = await host.peers.send(calls.ctx(planner.session_id), {"peer": "advisor", "body": "which cache?"})
    await host.start_run(advisor.session_id, "run-1")  # the advisor answers from its open run (exact live sender)

    # The advisor received it, and holds nothing back: not even its inbox shows the sender without `read`.
    assert await host.peers.inbox_tool_definition(advisor.session_id) is not None
    assert await host.peers.reply_tool_definition(advisor.session_id) is None
    assert (await host.peers.inbox(calls.ctx(advisor.session_id), {}))["error"]["code"] == "peer_message:not_granted"
    for operation in ("context", "read", "send", "control"):
        assert not (await host.peers.authorize(advisor.session_id, planner.session_id, operation)).allowed
    await host.peers.set_grant(planner.session_id, source_session_id=advisor.session_id, read=True,
                               principal="acme/advice")
    [entry] = (await host.peers.inbox(calls.ctx(advisor.session_id), {}))["messages"]
    assert (entry["message_id"], entry["sender_session_id"], entry["principal"], entry["reply_peer"]) == (
        sent["message_id"], planner.session_id, f"session:{planner.session_id}", None)
    reply = {"peer": "planner", "message_id": sent["message_id"], "body": "the LRU one"}
    assert (await host.peers.reply(calls.ctx(advisor.session_id), reply))["error"]["code"] == \
        "peer_message:unknown_peer"

    # The host gives the advisor a route back (no send grant): a reply is authorized by the message it answers,
    # so only a real reference from that very peer can be answered.
    await host.peers.register_route("planner", planner.session_id, source_session_id=advisor.session_id)
    plain = await host.peers.send(calls.ctx(advisor.session_id), {"peer": "planner", "body": "unasked"})
    assert plain["error"]["code"] == "peer_message:not_granted"
    forged = {**reply, "message_id": "0190a000-0000-7000-8000-00000000beef"}
    assert (await host.peers.reply(calls.ctx(advisor.session_id), forged))["error"]["code"] == \
        "peer_message:unknown_reference"
    answered = await host.peers.reply(calls.ctx(advisor.session_id), reply)
    assert answered["in_reply_to"] == sent["message_id"], answered

    [delivery] = await deliveries(host, planner.session_id, "run-1")  # the planner's open run
    assert delivery.principal == "acme/advice" and delivery.verified
    [accepted] = await of_type(host, planner.session_id, ev.ProducerMessageAccepted)
    assert (accepted.in_reply_to, accepted.reply) == (sent["message_id"], True)


async def test_a_tampered_stream_entry_is_detected_at_delivery_counted_and_never_delivered(host, calls):
    planner, advisor = await independent_trees(host)
    await route(host, planner, advisor, "advisor", send=True)
    sent = await host.peers.send(calls.ctx(planner.session_id), {"peer": "advisor", "body": "pay 10 EUR"})
    before = failures("mismatch")

    # Someone with write access to the server rewrites the accepted entry after the fact.
    record = await adapters(host).sessions.record(advisor.session_id)
    stream = keys.session_stream(record.partition, record.session_id)
    entries = []
    for entry_id, fields in await adapters(host).redis.xrange(stream):
        if fields[b"type"] == b"ProducerMessageAccepted":
            fields[b"data"] = json.dumps({**json.loads(fields[b"data"]), "body": "pay 10000 EUR"})
        entries += [entry_id, len(fields), *[part for pair in fields.items() for part in pair]]
    # Stream entries cannot be edited in place: the whole stream is written again, every field kept.
    rewrite = """redis.call('DEL', KEYS[1])
local i = 1
while i <= #ARGV do
  local n = tonumber(ARGV[i + 1])
  redis.call('XADD', KEYS[1], ARGV[i], unpack(ARGV, i + 2, i + 1 + 2 * n))
  i = i + 2 + 2 * n
end"""
    await adapters(host).redis.eval(rewrite, 1, stream, *entries)

    assert await deliveries(host, advisor.session_id) == []
    assert failures("mismatch") == before + 1
    [discarded] = await of_type(host, advisor.session_id, ev.ProducerMessageDiscarded)
    assert (discarded.message_id, discarded.reason) == (sent["message_id"], "source_proof_mismatch")
    assert await host.obligations.pending_mail(advisor.session_id) == []


async def test_tree_mail_decided_by_a_worker_is_signed_and_verified_at_delivery(host, calls):
    root = await host.register_root("planner", "plans", rules={"child": "allow"})
    child = await host.register_child(root.session_id, "explore", "reads", rules={"parent": "allow"})
    await live(host, root)
    sent = await host.send_message(calls.ctx(root.session_id), {"to": child.handle, "body": "look"})
    [delivery] = await deliveries(host, child.session_id)
    assert (delivery.message_id, delivery.verified, delivery.principal) == (sent["message_id"], True, None)
    [accepted] = await of_type(host, child.session_id, ev.ProducerMessageAccepted)
    assert accepted.return_address == root.session_id and accepted.proof["key_id"] == "k1"


async def test_after_a_key_rotation_older_messages_still_verify_and_new_ones_use_the_new_key(redis_url, calls):
    async with proven_stack(redis_url) as host:
        planner, advisor = await independent_trees(host)
        await route(host, planner, advisor, "advisor", send=True)
        old = await host.peers.send(calls.ctx(planner.session_id), {"peer": "advisor", "body": "before"})
    rotated = ProofConfig(keys={"k2": "second-secret-of-32-characters-0", **KEYRING.keys}, current_key="k2")
    async with proven_stack(redis_url, rotated) as host:
        new = await host.peers.send(calls.ctx(planner.session_id), {"peer": "advisor", "body": "after"})
        got = await deliveries(host, advisor.session_id)
        assert [(d.message_id, d.verified) for d in got] == [(old["message_id"], True), (new["message_id"], True)]
        proofs = [e.proof["key_id"] for e in await of_type(host, advisor.session_id, ev.ProducerMessageAccepted)]
        assert proofs == ["k1", "k2"]


async def test_an_input_that_does_not_match_the_route_schema_is_refused_and_stores_nothing(host, calls):
    planner, advisor = await independent_trees(host)
    await host.peers.register_route("advisor", advisor.session_id, source_agent_type="planner", input_schema=QUESTION)
    await host.peers.set_grant(advisor.session_id, source_agent_type="planner", send=True, context=True)
    definition = await host.peers.send_tool_definition(planner.session_id)
    assert '"required":["question"]' in definition["description"]

    wrong = await host.peers.send(calls.ctx(planner.session_id), {"peer": "advisor", "body": {"q": "x"}})
    assert wrong["error"]["code"] == "peer_message:input_mismatch"
    assert await of_type(host, advisor.session_id, ev.ProducerMessageAccepted) == []
    right = await host.peers.send(calls.ctx(planner.session_id),
                                    {"peer": "advisor", "body": {"question": "LRU or LFU?"}})
    assert "message_id" in right
    [accepted] = await of_type(host, advisor.session_id, ev.ProducerMessageAccepted)
    assert json.loads(accepted.body) == {"question": "LRU or LFU?"}


async def test_a_retried_peer_send_returns_the_first_outcome_even_after_its_route_is_revoked(host, calls):
    planner, advisor = await independent_trees(host)
    await route(host, planner, advisor, "advisor", send=True, read=True)
    ctx = calls.ctx(planner.session_id)
    first = await host.peers.send(ctx, {"peer": "advisor", "body": "once"})
    assert first["status"] == "pending"
    # A read grant shows the target's state in the delivery's status (idle: queued, woken).
    status = await host.obligations.inspect(first["message_id"], planner.session_id)
    assert (status["status"], status["receipt"]["recipient_state"]) == ("accepted", "queued")
    await host.peers.revoke_route("advisor", source_session_id=planner.session_id)
    assert await host.peers.send(ctx, {"peer": "advisor", "body": "once"}) == first
    conflict = await host.peers.send(ctx, {"peer": "advisor", "body": "other"})
    assert conflict["error"]["code"] == "peer_message:idempotency_conflict"
    assert len(await of_type(host, advisor.session_id, ev.ProducerMessageAccepted)) == 1


async def test_with_proofs_off_mail_is_delivered_as_before_but_never_reported_verified(stack, calls):
    planner, advisor = await independent_trees(stack)
    await route(stack, planner, advisor, "advisor", send=True)
    await stack.peers.send(calls.ctx(planner.session_id), {"peer": "advisor", "body": "unsigned"})
    root = await stack.register_root("lead", "leads", rules={"child": "allow"})
    child = await stack.register_child(root.session_id, "explore", "reads", rules={"parent": "allow"})
    await live(stack, root)
    await stack.send_message(calls.ctx(root.session_id), {"to": child.handle, "body": "tree mail"})
    for session_id in (advisor.session_id, child.session_id):
        [delivery] = await deliveries(stack, session_id)
        assert delivery.verified is False
    assert all(e.proof is None for e in await of_type(stack, advisor.session_id, ev.ProducerMessageAccepted))


async def test_a_route_leads_only_to_an_independent_agent_never_to_another_trees_delegated_worker(host):
    planner, advisor = await independent_trees(host)
    worker = await host.register_child(advisor.session_id, "explore", "reads", rules={})
    # Each a ValueError, as before the codes, and a TreemailError with its own stable code.
    with pytest.raises(ValueError, match="delegated child") as refused:
        await host.peers.register_route("worker", worker.session_id, source_session_id=planner.session_id)
    assert isinstance(refused.value, TreemailError) and refused.value.code == "peer_route:delegated_child"
    with pytest.raises(ValueError, match="itself") as refused:
        await host.peers.register_route("me", planner.session_id, source_session_id=planner.session_id)
    assert isinstance(refused.value, TreemailError) and refused.value.code == "peer_route:self"
    with pytest.raises(ValueError, match="not a valid JSON Schema") as refused:
        await host.peers.register_route("advisor", advisor.session_id, source_session_id=planner.session_id,
                                       input_schema={"type": "no-such-type"})
    assert isinstance(refused.value, TreemailError) and refused.value.code == "peer_route:invalid_input_schema"
    assert await host.peers.routes(planner.session_id) == []


async def test_a_peer_send_decided_before_a_drain_and_committed_after_it_is_decided_again_and_refused(
    host, calls, monkeypatch
):
    from treemail.services import peers, servicedrain

    planner, advisor = await independent_trees(host)
    await route(host, planner, advisor, "advisor", send=True)
    real = servicedrain.service_draining
    reads = []

    async def drain_right_after_the_read(store):
        draining = await real(store)
        reads.append(draining)
        if len(reads) == 1:
            await host.disposal.drain()  # between this decision's read and its commit
        return draining

    monkeypatch.setattr(peers.servicedrain, "service_draining", drain_right_after_the_read)
    try:
        result = await host.peers.send(calls.ctx(planner.session_id), {"peer": "advisor", "body": "late"})
    finally:
        await host.disposal.undrain()

    assert reads[:2] == [False, True]  # the commit refused the first decision; the second read the drain
    assert "draining" in result["error"]["code"], result
    assert await of_type(host, advisor.session_id, ev.ProducerMessageAccepted) == []


async def test_an_inbox_entry_whose_sender_the_reader_may_not_read_answers_not_granted_in_every_partition(
    host, calls,
):
    """Nothing is left out of a page silently: an entry from a sender the reader holds no ``read`` grant on is
    listed by id with ``peer_message:not_granted`` (and none of its provenance), the same whether the sender's
    stream is in the reader's partition or another."""
    advisor = await host.register_root("advisor", "reviews designs", rules={}, status="idle")
    partitions = adapters(host).config.service.partitions
    own = keys.partition_of(advisor.root_session_id, partitions)
    by_partition = {}
    while len(by_partition) < 4:
        sender = await host.register_root("planner", "plans the work", rules={})
        at = keys.partition_of(sender.root_session_id, partitions)
        if (at == own) == (not by_partition) and at not in by_partition:  # the reader's own partition first
            by_partition[at] = sender
    same, granted, *others = by_partition.values()
    sent = {}
    for sender in by_partition.values():
        await live(host, sender)
        await route(host, sender, advisor, "advisor", send=True)
        sent[sender.session_id] = (await host.peers.send(calls.ctx(sender.session_id),
                                                         {"peer": "advisor", "body": "hello"}))["message_id"]
    await host.peers.set_grant(granted.session_id, source_session_id=advisor.session_id, read=True)
    await deliveries(host, advisor.session_id)  # every send admitted into the advisor's inbox

    page = await host.peers.inbox(calls.ctx(advisor.session_id), {"limit": 10})
    rows = {row["message_id"]: row for row in page["messages"]}
    assert set(rows) == set(sent.values()) and page["next_cursor"] is None  # every entry listed
    assert rows[sent[granted.session_id]]["sender_session_id"] == granted.session_id
    for sender in (same, *others):
        row = rows[sent[sender.session_id]]
        assert set(row) == {"message_id", "at", "error"}, row  # no sender, principal or route back
        assert row["error"]["code"] == "peer_message:not_granted"
    # One page at a time: a withheld entry holds its place, so the cursor pages through them all.
    first = await host.peers.inbox(calls.ctx(advisor.session_id), {"limit": 3})
    rest = await host.peers.inbox(calls.ctx(advisor.session_id), {"limit": 3, "cursor": first["next_cursor"]})
    assert [r["message_id"] for r in first["messages"] + rest["messages"]] == [r["message_id"] for r in page["messages"]]
