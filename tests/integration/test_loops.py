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
