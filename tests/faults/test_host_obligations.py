"""Faults (obligations that survive a failing host): kill -9 of the host at each point of finish_run and dispose,
repeated, leaves exactly one settlement notice per settlement; a provider that never claims stays within the
attempt budget."""

import os
import signal
import subprocess
import sys

import pytest

from tests.integration.conftest import adapters, make_config, running_stack
from treemail.adapters.connection import connect
from treemail.adapters.eventstore import EventStore
from treemail.adapters.wakes import WakeReader
from treemail.domain import events as ev
from treemail.domain.commands import SendArguments, SendContext, SendMessage, StartRun
from treemail.services.obligations import ObligationService
from treemail.services.sends import SendService
from treemail.services.sessions import SessionService
from treemail.services.settlement import SettlementService
from treemail.testing import TestClock

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
RULES = {"parent": "allow", "child": "allow"}


def run_host(url: str, operation: str, session_id: str, run_id: str, after: int) -> int:
    """The host process doing one finish_run or dispose, killed before its (after+1)th append."""
    process = subprocess.run([sys.executable, "-m", "tests.faults.hostkill", url, operation, session_id, run_id,
                              str(after)], cwd=ROOT, timeout=30, capture_output=True)
    assert process.returncode in (0, -signal.SIGKILL), process.stderr.decode()[-2000:]
    return process.returncode


async def settlement_notices(host, parent_id: str, child_id: str) -> list[ev.ProducerMessageAccepted]:
    return [e for _, e in await adapters(host).store.read(await adapters(host).sessions.record(parent_id))
            if isinstance(e, ev.ProducerMessageAccepted) and e.owner == "settlement" and child_id in e.body]


async def settled(host, child_id: str) -> list[ev.SessionSettled]:
    return [e for _, e in await adapters(host).store.read(await adapters(host).sessions.record(child_id))
            if isinstance(e, ev.SessionSettled)]


async def announced_child(host, root, n: int, consume: bool = True):
    """A child given mail by its parent (announced); ``consume``: its run took it, else it is still pending."""
    await host.start_run(root.session_id, f"root-{n}")
    child = await host.register_child(root.session_id, "worker", "x", rules=RULES, status="idle")
    await host.start_run(child.session_id, "run-1")
    sent = await host.send_message(SendContext(root.session_id, f"root-{n}", f"c-{n}"),
                                   {"to": child.handle, "body": "do it"})
    assert "message_id" in sent, sent
    if consume:
        [delivery] = await host.claim(child.session_id, "run-1")
        await host.consume(child.session_id, delivery.message_id)
    await host.finish_run(root.session_id, f"root-{n}")
    return child


@pytest.mark.slow
@pytest.mark.expected_duration_s(14)
async def test_kill_9_at_each_point_of_finish_run_repeated_leaves_exactly_one_notice(redis_url):
    async with running_stack(redis_url) as host:
        root = await host.register_root("planner", "x", rules=RULES, status="idle")
        n = 0
        for after in (0, 1, 5):  # before the finish's one step, after it (it completes), and a run to the end
            for _ in range(2):
                n += 1
                child = await announced_child(host, root, n)
                code = run_host(redis_url, "finish", child.session_id, "run-1", after)
                assert (code == -signal.SIGKILL) == (after < 1), (after, code)
                # The restarted host finishes the run again, and again.
                gates = {await host.finish_run(child.session_id, "run-1", "completed", "closing words")
                         for _ in range(2)}
                assert gates == {"queued"}, (after, gates)
                assert len(await settlement_notices(host, root.session_id, child.session_id)) == 1, after
                [one] = await settled(host, child.session_id)
                assert one.notice == "queued" and one.message_id is not None


@pytest.mark.slow
@pytest.mark.expected_duration_s(27)
async def test_kill_9_at_each_point_of_dispose_repeated_leaves_exactly_one_notice(redis_url):
    async with running_stack(redis_url) as host:
        root = await host.register_root("planner", "x", rules=RULES, status="idle")
        n = 0
        # The disposal's steps: the cutoff, the unread message returned to its sender, the close with its notice.
        for after in (0, 1, 2, 3):
            for _ in range(2):
                n += 1
                child = await announced_child(host, root, n, consume=False)
                code = run_host(redis_url, "dispose", child.session_id, "run-1", after)
                assert (code == -signal.SIGKILL) == (after < 3), (after, code)
                await host.obligations.reconcile(interrupted_runs=True)  # completes a disposal past its cutoff
                for _ in range(2):
                    assert (await host.disposal.dispose(child.session_id, "aborted", "stopped early")).settlement \
                        == "queued", after
                assert len(await settlement_notices(host, root.session_id, child.session_id)) == 1, after
                assert len(await settled(host, child.session_id)) == 1, after
                returned = [e for _, e in await adapters(host).store.read(
                    await adapters(host).sessions.record(root.session_id))
                    if isinstance(e, ev.ProducerMessageAccepted) and e.owner == "returned" and child.handle in e.body]
                assert len(returned) == 1, after


@pytest.mark.slow
@pytest.mark.expected_duration_s(10)
async def test_a_provider_that_never_claims_stays_within_the_attempt_budget(redis_url):
    """Every wake starts a run that ends before its first claim (the provider is down), for 60 s of a controlled
    clock, then 200 s more: the session is woken once per backed-off attempt, and parked after the budget."""
    config = make_config(redis_url)
    redis = await connect(redis_url, config.service)
    store = EventStore(redis, config.service)
    await store.load_scripts()
    await store.ensure_wake_groups(config.service.partitions)
    clock = TestClock(1_700_000_000.0)
    start = clock.now()
    sessions = SessionService(store, config, clock=clock)
    settlement = SettlementService(sessions)
    pump = ObligationService(sessions, clock)
    reader = WakeReader(redis, config.service)
    try:
        root = await sessions.register(agent_type="plan", description="x", rules=RULES, send_message_tool=True,
                                       status="running", parent_session_id=None)
        child = await sessions.register(agent_type="explore", description="x", rules=RULES, send_message_tool=True,
                                        status="idle", parent_session_id=root.session_id)
        await sessions.execute(StartRun(root.session_id, "run-1"))
        outcome = (await SendService(store, config.messaging, clock=clock).decide([SendMessage(
            "cmd-1", SendContext(root.session_id, "run-1", "call-1"), SendArguments(child.handle, "hello"), "r",
        )])).outcomes["cmd-1"]
        assert "ok" in outcome, outcome
        runs = 0

        async def run_for(seconds: float, step: float = 0.25) -> None:
            nonlocal runs
            end = clock.now() + seconds
            while clock.now() < end:
                await pump.step(now=clock.now())
                for wake in await reader.read("runner", 10, None):
                    runs += 1
                    await sessions.execute(StartRun(child.session_id, f"run-{runs}"))
                    await settlement.finish(child.session_id, f"run-{runs}", None, None)  # no claim: it failed
                    await reader.ack(wake)
                clock.advance(step)

        await run_for(60.0)
        # Attempts at 0, 1, 3, 7, 15 and 31 s (backoff 1, 2, 4, 8, 16, then 32 s to 63 s): 6 in 60 s, not thousands.
        assert runs == 6
        await run_for(200.0)
        assert runs == 8  # the budget: 8 attempts, then parked
        history = [e for _, e in await store.read(child)]
        [parked] = [e for e in history if isinstance(e, ev.ProducerMessageParked)]
        assert parked.reason == "max_attempts"
        assert sum(isinstance(e, ev.SessionWakeRequested) for e in history) <= 9
        assert len(history) < 60  # the stream stays small: one message cost a bounded number of events
        assert clock.now() - start >= 260
    finally:
        await redis.aclose()
