"""Invariant 2: exact guards under concurrency, with several worker processes racing on one recipient."""

import asyncio
import collections

import pytest

from treemail.host import SendContext, Treemail

from .conftest import make_config, worker_processes

pytestmark = pytest.mark.cluster


async def race(url, *, senders, sends_each, duplicates, **messaging):
    config = make_config(url, **messaging)
    async with worker_processes(url, 3, **messaging):
        host = await Treemail.connect(config, url)
        try:
            root = await host.register_root("planner", "x", rules={"child": "allow"})
            target = await host.register_child(root.session_id, "target", "the contended recipient")
            rules = {"sibling": "allow"}
            peers = [await host.register_child(root.session_id, "sender", "x", rules=rules) for _ in range(senders)]
            for peer in peers:
                await host.start_run(peer.session_id, "run-1")
            jobs = []
            for peer in peers:
                for n in range(sends_each):
                    ctx = SendContext(peer.session_id, "run-1", f"call-{n}")
                    args = {"to": target.handle, "body": f"{peer.handle} #{n}"}
                    # The same tool call arrives `duplicates` times at once, as retries would.
                    jobs.extend((peer.session_id, ctx, args) for _ in range(duplicates))
            results = await asyncio.gather(*(host.send_message(ctx, args) for _, ctx, args in jobs))
            history = await host.history(target.session_id)
        finally:
            await host.close()
    return jobs, results, history


def accepted_in(history):
    return [e for _, e in history if type(e).__name__ == "ProducerMessageAccepted"]


# Races are probabilistic: each guard is raced several times.
ROUNDS = pytest.mark.parametrize("round_", range(3))


@ROUNDS
async def test_concurrent_senders_admit_exactly_max_pending_per_session(redis_url, round_):
    jobs, results, history = await race(
        redis_url, senders=12, sends_each=5, duplicates=2, max_pending_per_session=7, max_inflight_per_pair=0
    )
    accepted = accepted_in(history)
    assert len(accepted) == 7
    assert len({e.message_id for e in accepted}) == 7
    codes = collections.Counter(r.get("error", {}).get("code", "ok") for r in results)
    assert set(codes) == {"ok", "send_message:inbox_full"}
    # Every duplicate of one tool call got the same answer; accepted ones name the same message.
    by_key = collections.defaultdict(list)
    for (sender, ctx, _), result in zip(jobs, results):
        by_key[(sender, ctx.tool_call_id)].append(result)
    assert all(all(r == answers[0] for r in answers) for answers in by_key.values())
    accepted_ids = {answers[0]["message_id"] for answers in by_key.values() if "message_id" in answers[0]}
    assert accepted_ids == {e.message_id for e in accepted}


@ROUNDS
async def test_concurrent_senders_admit_exactly_max_inflight_per_pair(redis_url, round_):
    jobs, results, history = await race(
        redis_url, senders=4, sends_each=10, duplicates=2, max_pending_per_session=1000, max_inflight_per_pair=3
    )
    per_pair = collections.Counter(e.sender_session_id for e in accepted_in(history))
    assert sorted(per_pair.values()) == [3, 3, 3, 3]
    codes = collections.Counter(r.get("error", {}).get("code", "ok") for r in results)
    assert codes["ok"] == 2 * 12  # each accepted tool call answered twice, identically


async def test_one_event_per_idempotency_key_under_concurrent_retries(redis_url):
    jobs, results, history = await race(
        redis_url, senders=5, sends_each=8, duplicates=4, max_pending_per_session=1000, max_inflight_per_pair=0
    )
    accepted = accepted_in(history)
    keys = collections.Counter((e.sender_session_id, e.tool_call_id) for e in accepted)
    assert len(accepted) == 40 and set(keys.values()) == {1}
