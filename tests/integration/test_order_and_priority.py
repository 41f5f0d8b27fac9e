"""Order, read receipts and priority through the real stack: numbers per directed pair under two workers,
claims in pair order, the read receipt (host call and tool), urgent mail within the starvation bound."""

import asyncio

import pytest

from treemail.domain.errors import Code

from .conftest import Calls, running_stack

# Numbers are given in the recipient's own atomic step: the same on one Valkey and a 3-master cluster.
pytestmark = pytest.mark.cluster


async def family(host):
    root = await host.register_root("planner", "plans", rules={"child": "allow"})
    child = await host.register_child(root.session_id, "explore", "reads", rules={"parent": "allow"})
    sibling = await host.register_child(root.session_id, "review", "reviews", rules={"sibling": "allow"})
    for session in (root, child, sibling):
        await host.start_run(session.session_id, "run-1")
    return root, child, sibling


async def test_two_workers_number_each_pair_and_claims_keep_its_order_and_the_receipt_follows(redis_url):
    async with running_stack(redis_url, workers=2, max_inflight_per_pair=0) as tm:
        root, child, sibling = await family(tm)
        calls = Calls()
        # when two senders race ten and six sends at the child through two workers
        sends = [(root, i) for i in range(10)] + [(sibling, i) for i in range(6)]
        # (the host's own sends: their results always carry the number)
        results = await asyncio.gather(*[
            tm.send(sender.session_id, child.handle, f"{sender.handle} {i}") for sender, i in sends])
        # then each pair's numbers are exactly 1..n, none lost or given twice
        number = {r["message_id"]: r["sequence"] for r in results}
        by_sender = {root.session_id: [], sibling.session_id: []}
        for (sender, _), result in zip(sends, results):
            by_sender[sender.session_id].append(result["sequence"])
        assert sorted(by_sender[root.session_id]) == list(range(1, 11))
        assert sorted(by_sender[sibling.session_id]) == list(range(1, 7))
        # and a claim hands each pair out in its numbers' order
        claimed = await tm.claim(child.session_id, "run-1")
        assert len(claimed) == 16
        for sender in (root, sibling):
            mine = [number[d.message_id] for d in claimed if d.sender_session_id == sender.session_id]
            assert mine == sorted(mine)
        # and the read receipt counts what the child consumed, a pair at a time
        assert await tm.history.read_receipt(root.session_id, child.session_id) == {
            "sender_session_id": root.session_id, "recipient_session_id": child.session_id,
            "sent_through": 10, "consumed_through": 0}
        for delivery in claimed:
            if delivery.sender_session_id == root.session_id and number[delivery.message_id] <= 4:
                await tm.consume(child.session_id, delivery.message_id)
        assert (await tm.history.read_receipt(root.session_id, child.session_id))["consumed_through"] == 4
        assert (await tm.history.read_receipt(sibling.session_id, child.session_id))["consumed_through"] == 0
        # and the model's tool answers the same question, once the host installed it
        ctx = calls.ctx(root.session_id)
        refused = await tm.tools.call(ctx, "read_receipt", {"to": child.handle})
        assert refused["error"]["code"] == Code.UNKNOWN_TOOL.value
        await tm.tools.install(root.session_id, ["read_receipt"])
        assert await tm.tools.call(ctx, "read_receipt", {"to": child.handle, "sequence": 4}) == {
            "to": child.handle, "sent_through": 10, "consumed_through": 4, "read": True}
        assert (await tm.tools.call(ctx, "read_receipt", {"to": child.session_id, "sequence": 5}))["read"] is False
        unknown = await tm.tools.call(ctx, "read_receipt", {"to": "explore_00000000"})
        assert unknown["error"]["code"] == Code.RECEIPT_UNKNOWN_RECIPIENT.value


async def test_urgent_mail_passes_normal_mail_at_most_the_bound_and_only_where_the_host_allows(redis_url, calls):
    async with running_stack(redis_url, max_inflight_per_pair=0) as stack:
        await urgent_within_the_bound(stack, calls)


async def urgent_within_the_bound(stack, calls):
    root, child, sibling = await family(stack)
    # given a normal message to the child, then ten urgent ones the host sends
    normal = await stack.send(root.session_id, child.handle, "routine status")
    urgent = [await stack.send(root.session_id, child.handle, f"stop {i}", urgent=True) for i in range(10)]
    # then the child's next boundary hands out eight urgent ones, then the normal one, then the rest
    order = [d.message_id for d in await stack.claim(child.session_id, "run-1")]
    ids = [r["message_id"] for r in urgent]
    assert order == ids[:8] + [normal["message_id"]] + ids[8:]
    # and the model may ask for urgent only where its host installed urgent_send
    ctx = calls.ctx(sibling.session_id)
    plain = await stack.send_message(ctx, {"to": child.handle, "body": "now", "urgent": True})
    assert plain["error"]["code"] == Code.INVALID_ARGUMENTS.value
    definition = next(d for d in await stack.tools.definitions(sibling.session_id) if d["name"] == "send_message")
    assert "urgent" not in definition["input_schema"]["properties"]
    await stack.tools.install(sibling.session_id, ["urgent_send", "read_receipt"])
    definition = next(d for d in await stack.tools.definitions(sibling.session_id) if d["name"] == "send_message")
    assert definition["input_schema"]["properties"]["urgent"]["type"] == "boolean"
    chatter = await stack.send_message(calls.ctx(sibling.session_id), {"to": child.handle, "body": "fyi"})
    sent = await stack.send_message(calls.ctx(sibling.session_id), {"to": child.handle, "body": "now", "urgent": True})
    assert sent["sequence"] == 2
    assert [d.message_id for d in await stack.claim(child.session_id, "run-1")] == [
        sent["message_id"], chatter["message_id"]]
