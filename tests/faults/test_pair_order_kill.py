"""Per-pair order under kill -9: two worker processes, killed and replaced while two senders each send in turn
to one recipient that claims and consumes as it goes. Every pair's numbers come out 1..n in sending order,
claims hand each pair out in that order, and the read receipt ends at n."""

import asyncio
import random

import pytest

from treemail.host import SendContext, Treemail

from .helpers import WorkerPool, config_for

MESSAGING = {"max_pending_per_session": 100, "max_inflight_per_pair": 0}
PER_SENDER = 25


@pytest.mark.slow
@pytest.mark.expected_duration_s(15)
async def test_pair_numbers_and_claim_order_survive_kill_9_of_workers(redis_url):
    rng = random.Random(20261202)
    config = config_for(redis_url, decision_timeout_s=20, **MESSAGING)
    async with WorkerPool(redis_url, **MESSAGING) as pool:
        await pool.start(2)
        host = await Treemail.connect(config, redis_url)
        try:
            root = await host.register_root("planner", "plans", rules={"child": "allow"})
            child = await host.register_child(root.session_id, "explore", "reads", rules={"parent": "allow"})
            sibling = await host.register_child(root.session_id, "review", "reviews", rules={"sibling": "allow"})
            for session in (root, child, sibling):
                await host.start_run(session.session_id, "run-1")
            for session in (root, sibling):  # they read receipts: their results carry each message's number
                await host.tools.install(session.session_id, ["read_receipt"])
            numbers: dict[str, list[int]] = {root.session_id: [], sibling.session_id: []}
            sequence_of: dict[str, int] = {}
            claimed: list[tuple[str, int]] = []
            sending = 2

            async def sender(session) -> None:
                nonlocal sending
                for i in range(PER_SENDER):
                    ctx = SendContext(session.session_id, "run-1", f"call-{i}")
                    result = await host.send_message(ctx, {"to": child.handle, "body": f"#{i}"})
                    if i % 7 == 3:
                        # The same tool call again (a host retrying after a kill): the same number, nothing new.
                        again = await host.send_message(ctx, {"to": child.handle, "body": f"#{i}"})
                        assert again == result
                    numbers[session.session_id].append(result["sequence"])
                    sequence_of[result["message_id"]] = result["sequence"]
                sending -= 1

            async def recipient() -> None:
                while sending or len(claimed) < 2 * PER_SENDER:
                    for delivery in await host.claim(child.session_id, "run-1"):
                        claimed.append((delivery.sender_session_id, delivery.message_id))
                        await host.consume(child.session_id, delivery.message_id)
                    await asyncio.sleep(0.02)

            kills_while_sending = 0

            async def killer() -> None:
                # Kills go by the senders' progress, not by time: each lands while sends are being decided.
                nonlocal kills_while_sending
                for threshold in (8, 20, 32):
                    while sum(map(len, numbers.values())) < threshold:
                        await asyncio.sleep(0.005)
                    kills_while_sending += bool(sending)
                    assert pool.kill_random(rng) is not None
                    pool.spawn()

            await asyncio.wait_for(asyncio.gather(sender(root), sender(sibling), recipient(), killer()), 60)
            receipts = [await host.history.read_receipt(s.session_id, child.session_id) for s in (root, sibling)]
        finally:
            await host.close()
        assert len(pool.killed) == 3 and all(p.returncode == -9 for p in pool.killed)
        assert kills_while_sending == 3  # every kill landed while sends were being decided

    # Each sender awaited each send: its numbers are its sending order, none lost or given twice.
    assert numbers == {root.session_id: list(range(1, PER_SENDER + 1)),
                       sibling.session_id: list(range(1, PER_SENDER + 1))}
    # The recipient read every pair in that order, each message once.
    for sender_id in numbers:
        read = [sequence_of[message_id] for sent_by, message_id in claimed if sent_by == sender_id]
        assert read == list(range(1, PER_SENDER + 1))
    assert [(r["sent_through"], r["consumed_through"]) for r in receipts] == [(PER_SENDER, PER_SENDER)] * 2
