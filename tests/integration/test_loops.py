"""Loop detection through the real stack: causation on every message, a ping-pong refused with
send_message:loop_detected, one notice to the nearest common ancestor however many workers race, and a
fan-out/fan-in tree with new content refused never."""

import asyncio

import pytest

from treemail.domain import events as ev

from .conftest import Calls, running_stack

# A tree's keys share one slot: the same on a 3-master cluster.
pytestmark = pytest.mark.cluster

ALLOW = {"*": "allow"}


async def _exchange(host, calls: Calls, sender, recipient, body: str) -> dict:
    """``sender`` sends from its run; ``recipient`` claims and consumes it in its own (what it answers next)."""
    outcome = await host.send_message(calls.ctx(sender.session_id, f"run-{sender.session_id}"),
                                      {"to": recipient.handle, "body": body})
    if "message_id" in outcome:
        run = f"run-{recipient.session_id}"
        for delivery in await host.claim(recipient.session_id, run):
            await host.consume(recipient.session_id, delivery.message_id)
    return outcome


async def _loop_notices(host, session_id: str) -> list[ev.ProducerMessageAccepted]:
    return [e for _, e in await host.history(session_id)
            if isinstance(e, ev.ProducerMessageAccepted) and e.owner == "loop"]


async def test_siblings_ping_pong_is_refused_and_their_parent_is_told_once_with_two_workers(redis_url):
    async with running_stack(redis_url, workers=2) as host:
        calls = Calls()
        root = await host.register_root("plan", "planner", rules=ALLOW)
        a = await host.register_child(root.session_id, "explore", "a", rules=ALLOW)
        b = await host.register_child(root.session_id, "review", "b", rules=ALLOW)
        for session in (root, a, b):
            await host.start_run(session.session_id, f"run-{session.session_id}")
        await _exchange(host, calls, root, a, "Agree the API with review.")
        first = await _exchange(host, calls, a, b, "What do you think of the API?")
        await _exchange(host, calls, b, a, "Looks good to me!")
        await _exchange(host, calls, a, b, "Great, looks good to me too!")
        await _exchange(host, calls, b, a, "Looks good to me!")
        # Both sides now race near-duplicates: every one is refused, the parent is told once.
        racing = await asyncio.gather(*(
            host.send_message(calls.ctx(s.session_id, f"run-{s.session_id}"), {"to": r.handle, "body": body})
            for s, r, body in [(a, b, "Great, looks good to me too!"), (b, a, "Looks good to me!")] * 4))
        refused = [o for o in racing if o.get("error", {}).get("code") == "send_message:loop_detected"]
        assert len(refused) >= 4, racing
        notices = await _loop_notices(host, root.session_id)
        assert len(notices) == 1 and notices[0].chain_id is not None
        assert await _loop_notices(host, a.session_id) == await _loop_notices(host, b.session_id) == []
        [told] = await host.claim(root.session_id, f"run-{root.session_id}")
        assert told.owner == "loop" and told.text.startswith('<treemail_notice kind="loop_stopped">')
        assert a.handle in told.text and b.handle in told.text
        # Every answer joined the chain the first message of the conversation started.
        accepted = [e for _, e in await host.history(b.session_id) if isinstance(e, ev.ProducerMessageAccepted)]
        assert accepted[0].message_id == first["message_id"] and accepted[0].caused_by is not None
        assert {e.chain_of for e in accepted} == {notices[0].chain_id}


async def test_a_wide_fan_out_and_fan_in_with_new_content_is_never_refused(redis_url):
    async with running_stack(redis_url, workers=2) as host:
        calls = Calls()
        root = await host.register_root("plan", "planner", rules=ALLOW)
        await host.start_run(root.session_id, f"run-{root.session_id}")
        children = [await host.register_child(root.session_id, "explore", f"shard {i}", rules=ALLOW)
                    for i in range(12)]
        for child in children:
            await host.start_run(child.session_id, f"run-{child.session_id}")
            await _exchange(host, calls, root, child, "Count the rows of your shard.")
        outcomes = []
        for round_ in range(3):
            for i, child in enumerate(children):
                outcomes.append(await _exchange(host, calls, child, root,
                                                f"shard {i} round {round_}: {1000 * i + 37 * round_} rows"))
                outcomes.append(await _exchange(host, calls, root, child, "Thanks, continue with the next batch."))
        assert [o for o in outcomes if "error" in o] == []


async def _peer_say(host, calls: Calls, sender, peer: str, body: str, *, admit: bool = True) -> dict:
    """``sender`` stores a peer send from its run; with ``admit``, the host drives its admission now."""
    outcome = await host.peers.send(calls.ctx(sender.session_id, f"run-{sender.session_id}"),
                                    {"peer": peer, "body": body})
    if admit and "message_id" in outcome:
        await host.peers.deliver(sender.session_id, outcome["message_id"])
    return outcome


async def _take(host, recipient) -> None:
    run = f"run-{recipient.session_id}"
    for delivery in await host.claim(recipient.session_id, run):
        await host.consume(recipient.session_id, delivery.message_id)


async def test_a_ping_pong_between_two_trees_over_peer_routes_is_refused_at_admission_and_when_sent(redis_url):
    # Every admission is driven by the test, in the order it chooses (no inline first attempt).
    async with running_stack(redis_url, peer_admit_inline=False) as host:
        calls = Calls()
        planner = await host.register_root("planner", "plans the work", rules={})
        advisor = await host.register_root("advisor", "reviews designs", rules={})
        for source, target, name in ((planner, advisor, "advisor"), (advisor, planner, "planner")):
            await host.peers.register_route(name, target.session_id, source_session_id=source.session_id)
            await host.peers.set_grant(target.session_id, source_session_id=source.session_id, send=True, read=True)
        for session in (planner, advisor):
            await host.start_run(session.session_id, f"run-{session.session_id}")

        await _peer_say(host, calls, planner, "advisor", "What do you think of the API?")
        await _take(host, advisor)
        await _peer_say(host, calls, advisor, "planner", "Looks good to me!")
        await _take(host, planner)
        await _peer_say(host, calls, planner, "advisor", "Great, looks good to me too!")
        await _take(host, advisor)
        await _peer_say(host, calls, advisor, "planner", "Looks good to me!")
        await _take(host, planner)
        # Both store their next near-duplicate before either is admitted: neither is a loop on what the
        # senders read, and the advisor's becomes one once the planner's lands first.
        fifth = await _peer_say(host, calls, planner, "advisor", "Great, looks good to me too!", admit=False)
        sixth = await _peer_say(host, calls, advisor, "planner", "Looks good to me!", admit=False)
        assert fifth["status"] == sixth["status"] == "pending", (fifth, sixth)
        await host.peers.deliver(planner.session_id, fifth["message_id"])
        await host.peers.deliver(advisor.session_id, sixth["message_id"])
        assert (await host.obligations.inspect(fifth["message_id"]))["status"] == "accepted"
        refused = await host.obligations.inspect(sixth["message_id"])
        assert (refused["status"], refused["reason"]) == ("refused", "send_message:loop_detected"), refused
        admitted = [e.message_id for _, e in await host.history(planner.session_id)
                    if isinstance(e, ev.ProducerMessageAccepted)]
        assert sixth["message_id"] not in admitted and len(admitted) == 2

        # Once the advisor has read the planner's repeat, its next repeat is refused when sent: nothing stored.
        await _take(host, advisor)
        again = await _peer_say(host, calls, advisor, "planner", "Looks good to me!")
        assert again["error"]["code"] == "send_message:loop_detected", again
        assert "no new content" in again["error"]["message"]
        # Saying something new goes through.
        news = await _peer_say(host, calls, advisor, "planner", "One change: rename fetch_all to fetch_page.")
        assert (await host.obligations.inspect(news["message_id"]))["status"] == "accepted"
