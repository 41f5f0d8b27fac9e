"""Faults (delivery as an obligation): kill -9 a delivery pump and a worker mid-way while a flaky host drops claims;
every obligation is still met or parked, none twice."""

import asyncio
import collections
import os
import random
import signal
import subprocess
import sys

import pytest

from tests.conftest import backend_env
from tests.integration.conftest import WORKER_ENV, adapters, close_host, connect_host, messaging_env
from treemail.domain import events as ev
from treemail.host import SendContext

from .helpers import WorkerPool, config_for, load_until

MESSAGING = {
    "max_pending_per_session": 1000, "max_inflight_per_pair": 0, "max_outstanding_per_source": 1000,
    "attempt_timeout_s": 0.5, "backoff_initial_s": 0.05, "backoff_max_s": 0.2,
}
LOAD_S = 8.0


def spawn_pump(url: str) -> subprocess.Popen:
    env = {**os.environ, "REDIS_URL": url, **WORKER_ENV, **backend_env(), **messaging_env(**MESSAGING),
           "TREEMAIL_PUMP_METRICS_PORT": "-1", "TREEMAIL_PUMP_INTERVAL_S": "0.05"}
    return subprocess.Popen([sys.executable, "-m", "treemail.consumers.pump"], env=env, start_new_session=True,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def check_journey(message_id: str, steps: list[ev.Event]) -> str:
    """Each claim ends at most once (consumed, released or parked); returns how the message ended."""
    open_claim = False
    ends = []
    for step in steps:
        match step:
            case ev.ProducerMessageClaimed():
                assert not open_claim, f"{message_id} claimed twice without an end between"
                open_claim = True
            case ev.ProducerMessageReleased(reason="wake_unclaimed"):
                # A run the message was due in ended without claiming it: a failed attempt with no claim.
                assert not open_claim, f"{message_id}: unclaimed while claimed"
                ends.append("ProducerMessageReleased")
            case ev.ProducerMessageReleased() | ev.ProducerMessageConsumed():
                assert open_claim, f"{message_id}: {type(step).__name__} without a claim (doubled)"
                open_claim = False
                ends.append(type(step).__name__)
            case ev.ProducerMessageParked():
                open_claim = False
                ends.append("parked")
    assert ends.count("ProducerMessageConsumed") <= 1, f"{message_id} consumed twice"
    return ends[-1] if ends else "pending"


@pytest.mark.slow
@pytest.mark.expected_duration_s(14)
async def test_kill_9_of_a_pump_and_a_worker_mid_way_leaves_every_obligation_met_or_parked_once(redis_url):
    rng = random.Random(4004)
    config = config_for(redis_url, **MESSAGING)
    pump_processes = [spawn_pump(redis_url) for _ in range(2)]
    async with WorkerPool(redis_url, **MESSAGING) as pool:
        await pool.start(2)
        host = await connect_host(config, redis_url)
        try:
            root = await host.register_root("planner", "x", rules={"child": "allow"}, status="running")
            busy = [await host.register_child(root.session_id, "busy", "x", rules={"parent": "allow"},
                                              status="running") for _ in range(6)]
            sleepy = [await host.register_child(root.session_id, "sleepy", "x", rules={"parent": "allow"},
                                                status="idle") for _ in range(4)]
            for session in [root, *busy]:  # the root sends from its open run (exact live sender)
                await host.start_run(session.session_id, "run-main")
            sent: dict[str, str] = {}  # message id -> recipient
            chaos = asyncio.Event()
            chaos.set()
            loading = asyncio.Event()
            loading.set()

            async def sender() -> None:
                n = 0
                while loading.is_set():
                    to = rng.choice(busy + sleepy)
                    result = await host.send_message(SendContext(root.session_id, "run-main", f"c{n}"),
                                                     {"to": to.handle, "body": f"#{n}"})
                    assert "message_id" in result, result
                    sent[result["message_id"]] = to.session_id
                    n += 1
                    await asyncio.sleep(0.01)

            async def handle(session_id: str, run_id: str) -> None:
                for delivery in await host.claim(session_id, run_id):
                    roll = rng.random() if chaos.is_set() else 0.0
                    if roll < 0.6:
                        await host.consume(session_id, delivery.message_id)
                    elif roll < 0.8:
                        await host.release(session_id, delivery.message_id)
                    # else: the claim is dropped, as by a host that hung: the pump releases it.

            async def runner() -> None:
                """Busy sessions claim at their boundaries; sleeping ones are woken, served, put back to sleep."""
                woken = 0
                while loading.is_set() or chaos.is_set() or not await settled():
                    for session in busy:
                        try:
                            await handle(session.session_id, "run-main")
                        except Exception as error:  # noqa: BLE001 - a claim the pump released meanwhile
                            assert "not_claimed" in str(error) or "unknown_message" in str(error), error
                    for wake in await host.wakes("runner", count=10, block_ms=50):
                        woken += 1
                        run_id = f"wake-{woken}"
                        if await host.wake_run(wake, run_id):
                            try:
                                await handle(wake.session_id, run_id)
                            except Exception as error:  # noqa: BLE001
                                assert "not_claimed" in str(error) or "unknown_message" in str(error), error
                            await host.finish_run(wake.session_id, run_id)
                    await asyncio.sleep(0.02)

            async def settled() -> bool:
                endings = await journeys()
                return all(end in ("ProducerMessageConsumed", "parked") for end in endings.values())

            async def journeys() -> dict[str, str]:
                steps = collections.defaultdict(list)
                for session in {*sent.values()}:
                    for _, event in await host.history(session):
                        if isinstance(event, ev.MessageEvent):
                            steps[event.message_id].append(event)
                return {m: check_journey(m, steps.get(m, [])) for m in list(sent)}

            tasks = [asyncio.create_task(sender()), asyncio.create_task(runner())]
            await asyncio.sleep(LOAD_S / 2)
            victim = pump_processes[0]
            os.kill(victim.pid, signal.SIGKILL)
            victim.wait()
            assert pool.kill_random(rng) is not None
            pool.spawn()
            await load_until(lambda: len(sent) > 100, LOAD_S / 2, what="the flaky host's load")
            loading.clear()
            await tasks[0]
            chaos.clear()  # the host now consumes what it claims: the pump still owes the dropped claims
            await asyncio.wait_for(tasks[1], timeout=240)
            endings = await journeys()
            releases = collections.Counter()
            for session in {*sent.values()}:
                releases.update(e.reason for _, e in await host.history(session)
                                if isinstance(e, ev.ProducerMessageReleased))
            sender_history = [event for _, event in await host.history(root.session_id)]
            root_state = (await adapters(host).store.load(await adapters(host).sessions.record(root.session_id))).state
        finally:
            await close_host(host)
            for process in pump_processes:
                if process.poll() is None:
                    process.terminate()
                    process.wait(timeout=30)

    assert victim.returncode == -9 and pool.killed[0].returncode == -9
    assert len(sent) > 100
    # The load exercised what it claims to: claims the host dropped, released by the pumps.
    assert releases["attempt_timeout"] > 10 and releases["released"] > 10, releases
    outcome = collections.Counter(endings.values())
    assert set(outcome) <= {"ProducerMessageConsumed", "parked"}, outcome
    # The sender's record agrees with every recipient's stream: each settled once, capacity released exactly.
    settled_ids = [e.message_id for e in sender_history if isinstance(e, ev.MessageSettled)]
    sent_ids = [e.message_id for e in sender_history if isinstance(e, ev.MessageSent)]
    assert sorted(sent_ids) == sorted(sent)
    assert len(set(settled_ids)) == len(settled_ids)
    assert set(settled_ids) == {m for m, end in endings.items() if end == "ProducerMessageConsumed"}
    assert root_state.outstanding == outcome["parked"]
    print(f"\npump and worker kill -9: {len(sent)} messages, endings {dict(outcome)}, releases {dict(releases)}")
