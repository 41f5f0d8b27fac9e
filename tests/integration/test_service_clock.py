"""Every service decides by the clock it is given: the events it appends record that time, the sender's
own records of a send included, and the delivery pump's due index is computed from it."""

import pytest

from treemail.adapters import keys
from treemail.adapters.connection import connect
from treemail.adapters.eventstore import EventStore
from treemail.domain import events as ev
from treemail.domain.commands import SendArguments, SendContext, SendMessage, StartRun
from treemail.services.sends import SendService
from treemail.services.sessions import SessionService
from treemail.testing import TestClock

from .conftest import make_config

pytestmark = pytest.mark.cluster

NOW = 1_700_000_000.0



async def test_the_clock_a_service_is_given_dates_every_event_it_appends_and_the_due_index(redis_url):
    config = make_config(redis_url)
    client = await connect(redis_url, config.service)
    store = EventStore(client, config.service)
    await store.load_scripts()
    clock = TestClock(NOW)  # an engine's own clock, as its tests would pass one
    sessions = SessionService(store, config, clock=clock)
    sends = SendService(store, config.messaging, clock=clock)
    try:
        root = await sessions.register(agent_type="plan", description="plans", rules={"*": "allow"},
                                       send_message_tool=True, status="running", parent_session_id=None)
        child = await sessions.register(agent_type="explore", description="reads", rules={"*": "allow"},
                                        send_message_tool=True, status="idle", parent_session_id=root.session_id)
        await sessions.execute(StartRun(root.session_id, "run-1"))
        clock.advance(5)
        command = SendMessage("cmd-1", SendContext(root.session_id, "run-1", "call-1"),
                              SendArguments(to=child.handle, body="hello"), "client-1")
        outcome = (await sends.decide([command])).outcomes["cmd-1"]

        assert "ok" in outcome
        sent = [e for _, e in await store.read(child) if not isinstance(e, ev.SessionRegistered)]
        assert {type(e).__name__ for e in sent} >= {"ProducerMessageAccepted", "SessionWakeRequested"}
        assert {e.at for e in sent} == {NOW + 5}
        [receipt] = [e for _, e in await store.read(root) if isinstance(e, ev.MessageSent)]
        assert receipt.at == NOW + 5
        assert {e.at for _, e in await store.read(root) if not isinstance(e, ev.MessageSent)} == {NOW}
        # The woken child's entry in the due index: the wake's expiry, one attempt timeout after it.
        score = await client.zscore(keys.due_index(child.partition), child.session_id)
        assert score == NOW + 5 + config.messaging.attempt_timeout_s
    finally:
        await client.aclose()
