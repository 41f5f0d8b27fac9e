"""Faults: a cancel racing a claim, each in a host process killed (kill -9) at a point of its operation, then
done again by a restarted host: a message is never both delivered and cancelled."""

import asyncio

import pytest

from tests.integration.conftest import running_stack
from treemail.domain import events as ev

from .hostkill import run_host

RULES = {"*": "allow"}


@pytest.mark.slow
@pytest.mark.expected_duration_s(20)
async def test_cancel_racing_a_claim_under_kill_9_never_both_delivers_and_cancels(redis_url):
    async with running_stack(redis_url, workers=2) as host:
        root = await host.register_root("plan", "planner", rules=RULES)
        await host.start_run(root.session_id, "run-root")
        outcomes = set()
        # (kill the canceller before its append n, kill the claimer before its append n); 9: never killed.
        for round_, (cancel_after, claim_after) in enumerate([(0, 1), (1, 0), (9, 9)]):
            child = await host.register_child(root.session_id, "worker", f"w{round_}", rules=RULES)
            run = f"run-{round_}"
            await host.start_run(child.session_id, run)
            sent = await host.send(root.session_id, child.handle, f"task {round_}")
            message_id = sent["message_id"]
            await asyncio.gather(run_host(redis_url, "cancel", message_id, "-", cancel_after),
                                 run_host(redis_url, "claim", child.session_id, run, claim_after))
            # The restarted host does both again: each answers from what the stream holds.
            answer = await host.obligations.cancel(message_id)
            for delivery in await host.claim(child.session_id, run):
                await host.consume(child.session_id, delivery.message_id)
            pending = {m.message_id: m for m in await host.obligations.pending_mail(child.session_id)}
            if message_id in pending and pending[message_id].state == "claimed":
                await host.consume(child.session_id, message_id)  # claimed by the killed host, not yet consumed
            events = [e for _, e in await host.history(child.session_id) if getattr(e, "message_id", None) == message_id]
            claimed = [e for e in events if isinstance(e, ev.ProducerMessageClaimed)]
            cancelled = [e for e in events if isinstance(e, ev.ProducerMessageDiscarded) and e.reason == "cancelled"]
            answers = {e.outcome for e in events if isinstance(e, ev.MessageCancelAnswered)}
            assert len(claimed) + len(cancelled) == 1, (round_, events)  # exactly one of the two, never both
            assert answer["outcome"] == ("cancelled" if cancelled else "already_delivered"), (round_, answer)
            # Every recorded answer agrees with what happened to the message. (A cancel that finds the message
            # already settled on its sender answers from that settlement and records nothing: when the claim and
            # its consume win outright, no answer is on the recipient's stream.)
            assert answers <= {answer["outcome"]}, (round_, answers)
            assert answers or claimed, (round_, events)
            status = await host.obligations.inspect(message_id)
            assert status["status"] == "processed" and (status["reason"] == "cancelled") == bool(cancelled)
            outcomes.add(answer["outcome"])
        assert outcomes  # the figures vary with the race; each round's invariant is what is checked
