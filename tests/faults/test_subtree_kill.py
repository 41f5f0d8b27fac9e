"""Faults: kill -9 of the host in the middle of a subtree broadcast's fan-out; a fresh host resumes it with the
same key, and every recipient holds exactly one copy."""

import asyncio
import os
import signal
import sys

import pytest

from tests.integration.conftest import live, running_stack
from treemail.domain import events as ev

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
RULES = {"*": "allow"}


@pytest.mark.slow
@pytest.mark.expected_duration_s(10)
async def test_a_broadcast_cut_by_kill_9_mid_fan_out_resumes_with_exactly_one_copy_each(redis_url):
    async with running_stack(redis_url, workers=2) as tm:
        root = await tm.register_root("lead", "leads", rules=RULES)
        below = []
        for _ in range(3):
            child = await tm.register_child(root.session_id, "planner", "plans", rules=RULES)
            below.append(child)
            for _ in range(2):
                below.append(await tm.register_child(child.session_id, "worker", "works", rules=RULES))
        await live(tm, root)

        # The broadcasting host dies as its third copy is answered (the workers here keep deciding).
        process = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "tests.faults.broadcastkill", redis_url, root.session_id, "k", "3", cwd=ROOT,
            stderr=asyncio.subprocess.PIPE)
        _, stderr = await asyncio.wait_for(process.communicate(), 60)
        assert process.returncode == -signal.SIGKILL, stderr.decode()[-2000:]
        history = [e for _, e in await tm.history(root.session_id)]
        [started] = [e for e in history if isinstance(e, ev.SubtreeBroadcastStarted)]
        assert not [e for e in history if isinstance(e, ev.SubtreeBroadcastDelivered)]

        result = await tm.peers.broadcast_subtree(root.session_id, "stop and report", idempotency_key="k")
        assert result["broadcast_id"] == started.broadcast_id and result["refused"] == []
        assert {d["session_id"] for d in result["delivered"]} == {s.session_id for s in below}
        for session in below:
            copies = [e for _, e in await tm.history(session.session_id)
                      if isinstance(e, ev.ProducerMessageAccepted) and e.body == "stop and report"]
            assert len(copies) == 1, session
        [delivered] = [e for _, e in await tm.history(root.session_id) if isinstance(e, ev.SubtreeBroadcastDelivered)]
        assert len(delivered.accepted) == len(below)
