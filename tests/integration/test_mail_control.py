"""Expiry, supersede and cancel through the real stack, on the controllable clock: an expired message never
reaches a model and its sender reads why; latest wins for a key; cancel answers cancelled or
already_delivered, recorded on the recipient's stream."""

import pytest

from treemail.domain import events as ev
from treemail.domain.commands import SendContext

from .conftest import timed_stack

# A tree's keys share one slot: the same on a 3-master cluster.
pytestmark = pytest.mark.cluster

ALLOW = {"*": "allow"}


async def _family(host):
    root = await host.register_root("plan", "planner", rules=ALLOW)
    child = await host.register_child(root.session_id, "explore", "worker", rules=ALLOW)
    await host.start_run(root.session_id, "run-root")
    await host.start_run(child.session_id, "run-child")
    return root, child


async def test_expiry_supersede_and_cancel_end_to_end(redis_url):
    async with timed_stack(redis_url) as env:
        host = env.tm
        root, child = await _family(host)
        # Expiry: the stale STOP never reaches the child's model; the pump settles it at its expiry.
        stop = await host.send(root.session_id, child.handle, "STOP the deploy", expires_in_s=60)
        assert await env.advance(59) == []
        env.clock.advance(2)
        assert await host.claim(child.session_id, "run-child") == []  # a claim skips it, pump or not
        settled = await env.pump()
        assert [(e.message_id, e.reason) for e in settled if isinstance(e, ev.ProducerMessageDiscarded)] == [
            (stop["message_id"], "expired")]
        status = await host.obligations.inspect(stop["message_id"], root.session_id)
        assert (status["status"], status["reason"]) == ("processed", "expired")

        # Supersede: three progress reports while the child is busy; it reads only the latest.
        for percent in (10, 20, 30):
            await host.send(root.session_id, child.handle, f"budget left: {100 - percent}%", supersede_key="budget")
        delivered = await host.claim(child.session_id, "run-child")
        assert len(delivered) == 1 and "budget left: 70%" in delivered[0].text
        await host.consume(child.session_id, delivered[0].message_id)
        superseded = [e for _, e in await host.history(child.session_id)
                      if isinstance(e, ev.ProducerMessageDiscarded) and e.reason == "superseded"]
        assert len(superseded) == 2
        # Each names the message that took its place: the next report, and the one after it.
        reports = [e.message_id for _, e in await host.history(child.session_id)
                   if isinstance(e, ev.ProducerMessageAccepted) and e.supersede_key == "budget"]
        assert [(e.message_id, e.superseded_by) for e in superseded] == list(zip(reports, reports[1:]))

        # Cancel: before a claim it is cancelled (never delivered); after one, already_delivered.
        first = await host.send(root.session_id, child.handle, "rename the module")
        second = await host.send(root.session_id, child.handle, "and update the docs")
        assert (await host.obligations.cancel(first["message_id"], root.session_id))["outcome"] == "cancelled"
        [got] = await host.claim(child.session_id, "run-child")
        assert got.message_id == second["message_id"]
        late = await host.obligations.cancel(second["message_id"])
        assert (late["outcome"], late["by"]) == ("already_delivered", "host")
        again = await host.obligations.cancel(first["message_id"])
        assert (again["outcome"], again["reason"]) == ("cancelled", "cancelled")
        # Every answer is recorded, a cancel of mail settled before it too: how it had been settled is named.
        await host.consume(child.session_id, second["message_id"])
        consumed = await host.obligations.cancel(second["message_id"], root.session_id)
        expired = await host.obligations.cancel(stop["message_id"])
        assert (consumed["outcome"], expired["outcome"], expired["reason"]) == (
            "already_delivered", "cancelled", "expired")
        answers = [(e.message_id, e.outcome, e.settled, e.by) for _, e in await host.history(child.session_id)
                   if isinstance(e, ev.MessageCancelAnswered)]
        assert answers == [(first["message_id"], "cancelled", "", "sender"),
                           (second["message_id"], "already_delivered", "", "host"),
                           (first["message_id"], "cancelled", "cancelled", "host"),
                           (second["message_id"], "already_delivered", "consumed", "sender"),
                           (stop["message_id"], "cancelled", "expired", "host")]
        assert (await host.obligations.inspect(first["message_id"]))["reason"] == "cancelled"
        # The sender's own tool, where the host installed it.
        await host.tools.install(root.session_id, ["cancel_message"])
        third = await host.send(root.session_id, child.handle, "one more thing")
        context = SendContext(root.session_id, "run-root", "call-cancel")
        by_tool = await host.tools.call(context, "cancel_message", {"message_id": third["message_id"]})
        assert (by_tool["outcome"], by_tool["by"]) == ("cancelled", "sender")
        assert await host.claim(child.session_id, "run-child") == []
        # Bad options: a stable code, nothing stored.
        before = len(await host.history(child.session_id))
        bad = await host.send(root.session_id, child.handle, "x", expires_in_s=-1)
        assert bad["error"]["code"] == "send_message:invalid_arguments"
        assert len(await host.history(child.session_id)) == before


async def test_peer_mail_is_cancelled_in_its_sources_outbox_and_a_later_admission_never_lands(redis_url):
    from .conftest import running_stack
    from .test_peer_outbox import Clock, driver_of, independent_trees, route

    async with running_stack(redis_url, peer_admit_inline=False) as host:
        planner, advisor = await independent_trees(host)
        await route(host, planner, advisor, send=True, control=True)
        driver = driver_of(host, Clock())
        context = SendContext(planner.session_id, "run-1", "peer-1")
        sent = await host.peers.send(context, {"peer": "advisor", "body": "review cache.py"})
        answer = await host.obligations.cancel(sent["message_id"], planner.session_id)
        assert (answer["outcome"], answer["by"]) == ("cancelled", "sender")
        await driver.step()  # no attempt starts for a cancelled intent: nothing reaches the destination
        assert [e for _, e in await host.history(advisor.session_id) if isinstance(e, ev.ProducerMessageAccepted)] == []
        status = await host.obligations.inspect(sent["message_id"])
        assert (status["status"], status["reason"]) == ("processed", "cancelled")
        # Once admitted, it is cancelled on its destination, and its source learns the settlement from a driver.
        admitted = await host.peers.send(SendContext(planner.session_id, "run-1", "peer-2"),
                                         {"peer": "advisor", "body": "and review io.py"})
        await driver.step()
        assert (await host.obligations.inspect(admitted["message_id"]))["status"] == "accepted"
        assert (await host.obligations.cancel(admitted["message_id"]))["outcome"] == "cancelled"
        await host.start_run(advisor.session_id, "run-a")
        assert await host.claim(advisor.session_id, "run-a") == []
        driver.clock.time += 120
        await driver.step()
        status = await host.obligations.inspect(admitted["message_id"])
        assert (status["status"], status["settlement"]["reason"]) == ("processed", "cancelled")


async def test_a_model_sets_expiry_and_a_key_where_the_host_enabled_them(redis_url):
    from .conftest import running_stack

    async with running_stack(redis_url, mail_control=True) as host:
        root, child = await _family(host)
        definition = await host.tool_definition(root.session_id)
        assert {"expires_in_s", "supersede_key"} <= set(definition["input_schema"]["properties"])
        for n, left in enumerate((90, 80)):
            sent = await host.send_message(SendContext(root.session_id, "run-root", f"call-{n}"),
                                           {"to": child.handle, "body": f"budget left: {left}%",
                                            "supersede_key": "budget", "expires_in_s": 3600})
            assert "message_id" in sent, sent
        [latest] = await host.claim(child.session_id, "run-child")
        assert "budget left: 80%" in latest.text
        accepted = [e for _, e in await host.history(child.session_id) if isinstance(e, ev.ProducerMessageAccepted)]
        assert {e.supersede_key for e in accepted} == {"budget"} and all(e.expires_at for e in accepted)
