"""Invariant 4: a worker killed with SIGKILL mid-batch loses nothing and decides nothing twice."""

import asyncio
import collections
import os
import signal

import pytest

from treemail.host import SendContext, Treemail

from .conftest import LOADED_DECISION_TIMEOUT_S, live, make_config, worker_processes

pytestmark = pytest.mark.cluster


@pytest.mark.slow
async def test_kill_9_worker_mid_batch_every_command_decided_once(redis_url):
    # One sender may have at most 1000 unsettled sends (per-source capacity): a third go down, the rest come back up.
    messaging = {"max_pending_per_session": 100000, "max_inflight_per_pair": 0, "max_outstanding_per_source": 1000}
    config = make_config(redis_url, decision_timeout_s=LOADED_DECISION_TIMEOUT_S, **messaging)
    async with worker_processes(redis_url, 3, **messaging) as pool:
        host = await Treemail.connect(config, redis_url)
        try:
            root = await host.register_root("planner", "x", rules={"child": "allow"})
            children = [await host.register_child(root.session_id, "explore", "x", rules={"parent": "allow"})
                        for _ in range(20)]
            await live(host, root, *children)  # only a session's open run may send (exact live sender)
            jobs = [
                (SendContext(root.session_id, "run-1", f"call-{i}"), {"to": children[i % 20].handle, "body": f"#{i}"})
                if i % 3 == 0 else
                (SendContext(children[i % 20].session_id, "run-1", f"call-{i}"), {"to": root.handle, "body": f"#{i}"})
                for i in range(3000)
            ]

            answered = 0
            answered_at_kill = []

            async def send(ctx, args):
                nonlocal answered
                result = await host.send_message(ctx, args)
                answered += 1
                return result

            async def kill_workers():
                for victim in pool[:2]:
                    await asyncio.sleep(0.15)
                    os.kill(victim.pid, signal.SIGKILL)
                    answered_at_kill.append(answered)

            sends = asyncio.gather(*(send(ctx, args) for ctx, args in jobs))
            results, _ = await asyncio.gather(sends, kill_workers())
            # The kills landed while commands were still flowing.
            assert answered_at_kill[-1] < len(jobs)
            assert [p.poll() for p in pool[:2]] == [-9, -9]
            histories = [await host.history(c.session_id) for c in [root, *children]]
        finally:
            await host.close()

    # Every send was answered with a decision (none timed out), and all were accepted.
    assert all("message_id" in r for r in results), collections.Counter(
        r.get("error", {}).get("code") for r in results
    )
    accepted = [e for h in histories for _, e in h if type(e).__name__ == "ProducerMessageAccepted"]
    by_call = collections.Counter(e.tool_call_id for e in accepted)
    assert len(by_call) == 3000 and set(by_call.values()) == {1}
    # The answer each producer got names the one event in the stream.
    assert {r["message_id"] for r in results} == {e.message_id for e in accepted}
