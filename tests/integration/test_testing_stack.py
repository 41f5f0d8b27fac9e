"""treemail.testing as an engine author uses it: its own embedded Valkey, one clock for every part, time that
moves only when the test moves it."""

import socket
from urllib.parse import urlparse

import pytest

from treemail.domain import events as ev
from treemail.host import SendContext
from treemail.testing import TestClock, TestStack


async def test_a_stack_of_its_own_dates_every_decision_by_its_clock_and_stops_its_valkey():
    async with TestStack.start(start=1_000_000.0) as env:
        tm = env.tm
        root = await tm.register_root("planner", "plans", rules={"child": "allow"}, status="running")
        child = await tm.register_child(root.session_id, "explore", "reads", rules={"parent": "allow"})
        await tm.start_run(root.session_id, "run-1")
        env.clock.advance(5)
        await tm.send_message(SendContext(root.session_id, "run-1", "call-1"), {"to": child.handle, "body": "hi"})
        [accepted] = [e for _, e in await tm.history(child.session_id) if isinstance(e, ev.ProducerMessageAccepted)]
        assert accepted.at == 1_000_005.0  # decided by the worker, dated by the test's clock
        port = urlparse(env.url).port
    with socket.socket() as probe:
        assert probe.connect_ex(("127.0.0.1", port)) != 0  # its Valkey is gone with it


def test_the_clock_never_goes_back():
    clock = TestClock(start=10.0)
    clock.advance(2.5)
    assert (clock.now(), clock.monotonic()) == (12.5, 2.5)
    with pytest.raises(ValueError, match="never goes back"):
        clock.advance(-1)


async def test_a_whole_configuration_or_messaging_keys_not_both():
    from treemail.adapters.config import Config

    with pytest.raises(ValueError, match="not both"):
        async with TestStack.start(config=Config(), max_hops=2):
            pass
