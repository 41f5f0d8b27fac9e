"""Peer mail as an outbox, through the real stack between two trees: the intent stored on the source, admission
attempts by a driver on a controllable clock, status back, read and control grants, the shared capacity.

The host's own first attempt is off here (``peer_admit_inline=False``): every attempt is made by the test's
driver, on the test's clock, as the pump makes them.
"""

import asyncio
import time

import pytest

from treemail.adapters import keys
from treemail.domain.commands import SendContext
from treemail.domain import events as ev
from treemail.services.peerdelivery import PeerDriver, admission_digest
from treemail.services.sessions import SessionService

from .conftest import adapters, live, running_stack

pytestmark = pytest.mark.cluster


class Clock:
    """The driver's clock: the test moves it, nothing sleeps."""

    def __init__(self) -> None:
        # A moment ahead of the host's clock, which stored the intents the test's driver admits.
        self.time = time.time() + 1

    def now(self) -> float:
        return self.time

    def monotonic(self) -> float:
        return self.time


@pytest.fixture
async def host(redis_url):
    async with running_stack(redis_url, peer_admit_inline=False) as host:
        yield host


def driver_of(host, clock, cls=PeerDriver) -> PeerDriver:
    server = adapters(host)
    return cls(server.store, SessionService(server.store, server.config, clock), None, clock)


async def independent_trees(host, same_partition: bool = False, rules=None):
    """A planner and an advisor, each the root of its own tree: in different partitions (different slots), or
    in the same one."""
    planner = await host.register_root("planner", "plans the work", rules=rules or {})
    partitions = adapters(host).config.service.partitions
    for _ in range(200):
        advisor = await host.register_root("advisor", "reviews designs", rules={}, status="idle")
        same = keys.partition_of(advisor.root_session_id, partitions) == keys.partition_of(
            planner.root_session_id, partitions)
        if same == same_partition:
            await live(host, planner)
            return planner, advisor
    raise AssertionError("no such pair of partitions")


async def route(host, source, target, name="advisor", **grant):
    await host.peers.register_route(name, target.session_id, source_session_id=source.session_id)
    await host.peers.set_grant(target.session_id, source_session_id=source.session_id, **grant)


async def of_type(host, session_id, cls):
    return [e for _, e in await host.history(session_id) if isinstance(e, cls)]


async def state_of(host, session):
    server = adapters(host)
    return (await server.store.load(await server.sessions.record(session.session_id))).state


async def outstanding(host, session) -> int:
    return (await state_of(host, session)).outstanding


async def test_status_at_every_stage_is_read_by_the_sender_after_its_read_grant_and_by_the_host(host, calls):
    planner, advisor = await independent_trees(host)
    await route(host, planner, advisor, send=True)
    clock = Clock()
    driver = driver_of(host, clock)

    sent = await host.peers.send(calls.ctx(planner.session_id), {"peer": "advisor", "body": "review cache.py"})
    message_id = sent["message_id"]
    assert sent["status"] == "pending"
    # Stored on the source only: nothing reached the destination yet.
    assert await of_type(host, advisor.session_id, ev.ProducerMessageAccepted) == []
    assert (await host.obligations.inspect(message_id))["status"] == "pending"
    denied = await host.obligations.inspect(message_id, planner.session_id)
    assert denied["error"]["code"] == "peer_message:not_granted"  # no read grant: deny by default
    await route(host, planner, advisor, send=True, read=True)
    pending = await host.obligations.inspect(message_id, planner.session_id)
    assert (pending["status"], pending["attempts"], pending["peer"]) == ("pending", 0, "advisor")

    await driver.step()
    accepted = await host.obligations.inspect(message_id, planner.session_id)
    assert accepted["status"] == "accepted"
    [(position, admitted)] = [(seq, e) for seq, e in await host.history(advisor.session_id)
                              if isinstance(e, ev.ProducerMessageAccepted)]
    assert (accepted["receipt"]["position"], accepted["receipt"]["recipient_state"]) == (position, "queued")
    assert accepted["receipt"]["sequence"] == 1  # numbered by the destination at admission, the first of its pair
    assert admitted.message_id == message_id and admitted.principal == "session:" + planner.session_id
    assert (await host.obligations.inspect(message_id))["status"] == "accepted"

    await host.start_run(advisor.session_id, "run-a")
    [delivery] = await host.claim(advisor.session_id, "run-a")
    await host.consume(advisor.session_id, delivery.message_id)
    assert (await host.history.read_receipt(planner.session_id, advisor.session_id))["consumed_through"] == 1
    # Consumption alone writes nothing on the source: the settlement comes back through a driver.
    assert await of_type(host, planner.session_id, ev.MessageSettled) == []
    assert await outstanding(host, planner) == 1
    # The consumption made the source due at once: the driver's next pass settles it, with no wait for the
    # driver's own next look at an accepted delivery (up to a minute away).
    await driver.step()
    processed = await host.obligations.inspect(message_id, planner.session_id)
    assert (processed["status"], processed["settlement"]["outcome"]) == ("processed", "consumed")
    assert (await host.obligations.inspect(message_id))["status"] == "processed"
    assert await outstanding(host, planner) == 0
    assert (await state_of(host, planner)).outbox == {}


class LosesItsReply(PeerDriver):
    """Commits the admission, then the reply never arrives (a connection dropped after the server applied it)."""

    dropped = 0

    async def admit_commit(self, *args, **kwargs):
        await super().admit_commit(*args, **kwargs)
        if not LosesItsReply.dropped:
            LosesItsReply.dropped += 1
            raise ConnectionError("reply lost on purpose")
        return await super().admit_commit(*args, **kwargs)


async def test_an_admission_whose_reply_was_lost_is_retried_with_the_same_identity_and_admits_once(host, calls):
    planner, advisor = await independent_trees(host)
    await route(host, planner, advisor, send=True, read=True)
    clock = Clock()
    driver = driver_of(host, clock, LosesItsReply)
    sent = await host.peers.send(calls.ctx(planner.session_id), {"peer": "advisor", "body": "once"})

    await driver.step()
    first = await host.obligations.inspect(sent["message_id"])
    assert (first["status"], first["attempts"], first["reason"]) == ("pending", 1, "unanswered")
    assert len(await of_type(host, advisor.session_id, ev.ProducerMessageAccepted)) == 1  # it did land
    await driver.step()  # backing off: nothing happens before its time
    assert len(await of_type(host, planner.session_id, ev.PeerAttemptStarted)) == 1
    clock.time += 1
    await driver.step()
    second = await host.obligations.inspect(sent["message_id"])
    assert second["status"] == "accepted"
    [a, b] = await of_type(host, planner.session_id, ev.PeerAttemptStarted)
    assert (a.message_id, b.message_id, a.attempt, b.attempt) == (sent["message_id"], sent["message_id"], 1, 2)
    [message] = await of_type(host, advisor.session_id, ev.ProducerMessageAccepted)
    assert message.message_id == sent["message_id"]
    server = adapters(host)
    assert await server.store.recorded(await server.sessions.record(advisor.session_id),
                                       admission_digest(sent["message_id"])) is not None


async def test_attempts_back_off_then_park_and_only_a_control_grant_renews_them_never_after_processing(redis_url,
                                                                                                   calls):
    async with running_stack(redis_url, peer_admit_inline=False, max_pending_per_session=1) as host:
        planner, advisor = await independent_trees(host)
        await route(host, planner, advisor, send=True, read=True)
        # The advisor's inbox (one message) is filled by a third peer's mail.
        other = await host.register_root("planner", "another planner", rules={})
        await live(host, other)
        await route(host, other, advisor, "advisor", send=True)
        clock = Clock()
        driver = driver_of(host, clock)
        await host.peers.send(calls.ctx(other.session_id), {"peer": "advisor", "body": "first in"})
        await driver.step()
        sent = await host.peers.send(calls.ctx(planner.session_id), {"peer": "advisor", "body": "waits"})
        message_id = sent["message_id"]

        waits = []
        for _ in range(8):
            await driver.step()
            status = await host.obligations.inspect(message_id)
            waits.append(round(status.get("next_attempt_at", clock.time) - clock.time))
            clock.time = status.get("next_attempt_at", clock.time)
        parked = await host.obligations.inspect(message_id, planner.session_id)
        assert (parked["status"], parked["attempts"], parked["reason"]) == (
            "parked", 8, "attempts: send_message:inbox_full")
        assert waits == [1, 2, 4, 8, 16, 32, 60, 0]
        assert len(await of_type(host, advisor.session_id, ev.ProducerMessageAccepted)) == 1  # the other's only
        assert await outstanding(host, planner) == 1  # parked keeps its capacity

        refused = await host.obligations.retry(message_id, planner.session_id)
        assert refused["error"]["code"] == "peer_message:not_granted"
        await route(host, planner, advisor, send=True, read=True, control=True)
        await host.start_run(advisor.session_id, "run-a")
        [first_in] = await host.claim(advisor.session_id, "run-a")
        await host.consume(advisor.session_id, first_in.message_id)
        renewed = await host.obligations.retry(message_id, planner.session_id)
        assert (renewed["status"], renewed["attempts"]) == ("pending", 0)
        await driver.step()
        assert (await host.obligations.inspect(message_id))["status"] == "accepted"
        [delivery] = await host.claim(advisor.session_id, "run-a")
        await host.consume(advisor.session_id, delivery.message_id)
        clock.time += 120
        await driver.step()
        assert (await host.obligations.inspect(message_id))["status"] == "processed"
        again = await host.obligations.retry(message_id, planner.session_id)
        assert again["error"]["code"] == "retry_message:settled"  # processed: never rewound


async def test_a_definite_refusal_at_admission_releases_the_capacity_and_stays_inspectable(host, calls):
    planner, advisor = await independent_trees(host)
    await route(host, planner, advisor, send=True, read=True)
    clock = Clock()
    driver = driver_of(host, clock)
    sent = await host.peers.send(calls.ctx(planner.session_id), {"peer": "advisor", "body": "too late"})
    await route(host, planner, advisor, read=True)  # the send grant is taken back before the admission
    await driver.step()
    status = await host.obligations.inspect(sent["message_id"], planner.session_id)
    assert (status["status"], status["reason"]) == ("refused", "peer_message:not_granted")
    assert await outstanding(host, planner) == 0
    assert await of_type(host, advisor.session_id, ev.ProducerMessageAccepted) == []
    # Its sender was told it was stored, and a model never polls: a notice tells it of the refusal, once.
    [notice] = [e for e in await of_type(host, planner.session_id, ev.ProducerMessageAccepted) if e.owner == "returned"]
    assert sent["message_id"] in notice.body and "advisor" in notice.body and "peer_message:not_granted" in notice.body
    await driver.step()
    assert len([e for e in await of_type(host, planner.session_id, ev.ProducerMessageAccepted)
                if e.owner == "returned"]) == 1


async def test_a_disposed_sender_ends_what_it_stored_and_had_not_delivered(host, calls):
    """Past the source's cutoff a pending intent is refused at its next attempt, and a parked one is given up
    with the disposal: no retry will come for a disposed sender, and neither waits for ever."""
    planner, advisor = await independent_trees(host)
    await route(host, planner, advisor, send=True, read=True)
    clock = Clock()
    driver = driver_of(host, clock)
    parked = (await host.peers.send(calls.ctx(planner.session_id), {"peer": "advisor", "body": "too slow"}))
    clock.time += 86400 + 1
    await driver.step()  # past its deadline before any attempt: parked
    assert (await host.obligations.inspect(parked["message_id"]))["status"] == "parked"
    pending = await host.peers.send(calls.ctx(planner.session_id), {"peer": "advisor", "body": "late"})
    await host.disposal.dispose(planner.session_id, "aborted")
    given_up = await host.obligations.inspect(parked["message_id"])
    assert (given_up["status"], given_up["settlement"]["outcome"], given_up["reason"]) == (
        "processed", "discarded", "its sender was disposed before it was delivered")
    await driver_of(host, Clock()).step()  # a driver on the present clock: the pending intent's next attempt
    refused = await host.obligations.inspect(pending["message_id"])
    assert (refused["status"], refused["reason"]) == ("refused", "send_message:sender_closing")
    assert await of_type(host, advisor.session_id, ev.ProducerMessageAccepted) == []
    assert await outstanding(host, planner) == 0


async def test_consuming_peer_mail_in_the_senders_own_slot_settles_it_exactly_once(redis_url, calls):
    async with running_stack(redis_url, peer_admit_inline=False, max_outstanding_per_source=2) as host:
        planner, advisor = await independent_trees(host, same_partition=True)
        await route(host, planner, advisor, send=True)
        clock = Clock()
        driver = driver_of(host, clock)
        for body in ("one", "two"):
            await host.peers.send(calls.ctx(planner.session_id), {"peer": "advisor", "body": body})
        full = await host.peers.send(calls.ctx(planner.session_id), {"peer": "advisor", "body": "three"})
        assert full["error"]["code"] == "send_message:source_capacity"
        await driver.step()
        await host.start_run(advisor.session_id, "run-a")
        for delivery in await host.claim(advisor.session_id, "run-a"):
            await host.consume(advisor.session_id, delivery.message_id)
        assert await of_type(host, planner.session_id, ev.MessageSettled) == []
        assert await outstanding(host, planner) == 2
        clock.time += 120
        await driver.step()
        await driver.step()
        assert len(await of_type(host, planner.session_id, ev.MessageSettled)) == 2
        assert await outstanding(host, planner) == 0


async def test_the_capacity_counts_tree_mail_and_peer_intents_together_exactly_under_concurrent_senders(redis_url,
                                                                                                       calls):
    capacity = 6
    async with running_stack(redis_url, workers=2, peer_admit_inline=False,
                             max_outstanding_per_source=capacity, max_pending_per_session=100,
                             max_inflight_per_pair=100) as host:
        planner, advisor = await independent_trees(host, rules={"child": "allow"})
        await route(host, planner, advisor, send=True)
        child = await host.register_child(planner.session_id, "explore", "reads", rules={"parent": "allow"},
                                          status="idle")
        peer_sends = [host.peers.send(calls.ctx(planner.session_id), {"peer": "advisor", "body": f"p{i}"})
                      for i in range(8)]
        tree_sends = [host.send_message(calls.ctx(planner.session_id), {"to": child.handle, "body": f"t{i}"})
                      for i in range(8)]
        results = await asyncio.gather(*peer_sends, *tree_sends)
        ok = [r for r in results if "message_id" in r and "error" not in r]
        full = [r for r in results if r.get("error", {}).get("code") == "send_message:source_capacity"]
        assert len(ok) == capacity and len(ok) + len(full) == len(results), results
        assert await outstanding(host, planner) == capacity


async def test_the_peer_inbox_shows_readable_senders_a_page_at_a_time_and_withholds_the_others_by_code(redis_url, calls):
    async with running_stack(redis_url, max_inflight_per_pair=10) as host:  # the host admits each send at once
        planner, advisor = await independent_trees(host)
        await route(host, planner, advisor, send=True)
        sent = [(await host.peers.send(calls.ctx(planner.session_id), {"peer": "advisor", "body": f"m{i}"}))
                ["message_id"] for i in range(5)]
        context = calls.ctx(advisor.session_id)
        # An inbox read without the read grant is refused, not an empty page.
        refused = await host.peers.inbox(context, {})
        assert refused["error"]["code"] == "peer_message:not_granted" and "messages" not in refused
        await host.peers.set_grant(planner.session_id, source_session_id=advisor.session_id, read=True)
        pages, cursor = [], None
        while True:
            page = await host.peers.inbox(context, {"limit": 2, **({"cursor": cursor} if cursor else {})})
            pages.append([m["message_id"] for m in page["messages"]])
            cursor = page["next_cursor"]
            if cursor is None:
                break
        assert pages == [sent[4:2:-1], sent[2:0:-1], sent[0:1]]
        bad = await host.peers.inbox(context, {"cursor": "not-a-cursor"})
        assert bad["error"]["code"] == "peer_message:invalid_arguments"
        # The inbox shows provenance only from senders the reader is authorized for: a second sender without
        # a read grant sends too, and its message is listed by id with peer_message:not_granted, nothing more.
        other = await host.register_root("planner", "another planner", rules={})
        await host.start_run(other.session_id, "run-1")
        await route(host, other, advisor, send=True)
        unreadable = await host.peers.send(calls.ctx(other.session_id), {"peer": "advisor", "body": "x"})
        unreadable = unreadable["message_id"]
        listed = await host.peers.inbox(context, {"limit": 32})
        assert [m["message_id"] for m in listed["messages"]] == [unreadable, *sent[::-1]]
        assert listed["messages"][0]["error"]["code"] == "peer_message:not_granted"
        assert set(listed["messages"][0]) == {"message_id", "at", "error"} and other.session_id not in str(listed)


async def test_a_reader_following_the_inbox_cursor_reaches_every_message_while_more_arrive(redis_url, calls):
    # The pending and pair guards out of the way: the peer inbox's own bound is what is met here.
    async with running_stack(redis_url, max_inflight_per_pair=100, max_pending_per_session=100) as host:
        planner, advisor = await independent_trees(host)
        await route(host, planner, advisor, send=True)
        await host.peers.set_grant(planner.session_id, source_session_id=advisor.session_id, read=True)

        async def send(body):
            return (await host.peers.send(calls.ctx(planner.session_id), {"peer": "advisor", "body": body}))[
                "message_id"]

        first = [await send(f"m{i}") for i in range(30)]
        context = calls.ctx(advisor.session_id)
        page = await host.peers.inbox(context, {"limit": 10})
        seen = [m["message_id"] for m in page["messages"]]
        # More mail than the inbox keeps arrives while the reader is on its first page.
        later = [await send(f"late{i}") for i in range(5)]
        while page["next_cursor"] is not None:
            page = await host.peers.inbox(context, {"limit": 10, "cursor": page["next_cursor"]})
            seen += [m["message_id"] for m in page["messages"]]
        assert seen == first[::-1]
        # Two fit beside the 30 unread; the others wait on their source, refused for now, never dropped.
        state = await state_of(host, planner)
        waiting = [state.outbox[m] for m in later[2:]]
        assert [(row.status, row.reason) for row in waiting] == [("pending", "peer_message:inbox_full")] * 3
        status = await host.obligations.inspect(later[2])
        assert (status["status"], status["reason"]) == ("pending", "peer_message:inbox_full")
        assert status["retry_after_ms"] > 0
        newest = await host.peers.inbox(context, {"limit": 32})
        assert [m["message_id"] for m in newest["messages"]] == [*later[1::-1], *first[::-1]]


async def test_the_delivery_pump_is_a_peer_driver(host, calls):
    from treemail.consumers.pump import Pump

    planner, advisor = await independent_trees(host)
    await route(host, planner, advisor, send=True)
    server = adapters(host)
    pump = Pump(server.store, server.config, clock=Clock())
    sent = await host.peers.send(calls.ctx(planner.session_id), {"peer": "advisor", "body": "via the pump"})
    await pump.start()
    assert (await host.obligations.inspect(sent["message_id"]))["status"] == "accepted"
    [message] = await of_type(host, advisor.session_id, ev.ProducerMessageAccepted)
    assert message.message_id == sent["message_id"]
    # Nothing left to do: the source's entry waits for the settlement check, not for another attempt.
    await pump.step()
    assert len(await of_type(host, planner.session_id, ev.PeerAttemptStarted)) == 1


async def test_the_host_discards_a_parked_delivery_which_frees_its_capacity_and_reads_processed(host, calls):
    from treemail.domain.errors import LifecycleError

    planner, advisor = await independent_trees(host)
    await route(host, planner, advisor, send=True, read=True)
    clock = Clock()
    driver = driver_of(host, clock)
    sent = await host.peers.send(calls.ctx(planner.session_id), {"peer": "advisor", "body": "too slow"})
    with pytest.raises(LifecycleError):
        await host.peers.discard(planner.session_id, sent["message_id"])  # pending: not parked
    clock.time += 86400 + 1
    await driver.step()  # past its deadline before any attempt: parked
    assert (await host.obligations.inspect(sent["message_id"]))["status"] == "parked"
    await host.peers.discard(planner.session_id, sent["message_id"], "the advisor is retired")
    status = await host.obligations.inspect(sent["message_id"], planner.session_id)
    assert (status["status"], status["settlement"]["outcome"], status["reason"]) == (
        "processed", "discarded", "the advisor is retired")
    assert await outstanding(host, planner) == 0
    assert await of_type(host, advisor.session_id, ev.ProducerMessageAccepted) == []


async def test_a_retried_peer_send_gets_its_first_refusal_whatever_changed_since(redis_url):
    async with running_stack(redis_url, peer_admit_inline=False, max_pending_peer_deliveries=2,
                             max_outstanding_per_source=3) as host:
        planner, advisor = await independent_trees(host, rules={"child": "allow"})
        await route(host, planner, advisor, send=True)
        child = await host.register_child(planner.session_id, "explore", "reads", rules={"parent": "allow"},
                                          status="idle")
        for i in range(2):
            assert "message_id" in await host.peers.send(SendContext(planner.session_id, "run-1", f"p{i}"),
                                                         {"peer": "advisor", "body": f"p{i}"})
        call = SendContext(planner.session_id, "run-1", "the-third")
        first = await host.peers.send(call, {"peer": "advisor", "body": "third"})
        assert first["error"]["code"] == "peer_message:outbox_full"
        # Now the source's capacity is full too: the same tool call is still answered its first refusal.
        assert "message_id" in await host.send_message(calls_ctx(planner), {"to": child.handle, "body": "tree"})
        assert await outstanding(host, planner) == 3
        again = await host.peers.send(call, {"peer": "advisor", "body": "third"})
        assert again["error"]["code"] == "peer_message:outbox_full"
        # Other arguments under the same call are a conflict, never a second decision.
        other = await host.peers.send(call, {"peer": "advisor", "body": "another"})
        assert other["error"]["code"] == "peer_message:idempotency_conflict"


def calls_ctx(session) -> SendContext:
    return SendContext(session.session_id, "run-1", "tree-send")


async def test_a_stranger_inspecting_or_cancelling_peer_mail_gets_permission_denied_from_every_partition(host, calls):
    planner, advisor = await independent_trees(host)
    await route(host, planner, advisor, send=True, read=True, control=True)
    sent = await host.peers.send(calls.ctx(planner.session_id), {"peer": "advisor", "body": "review this"})
    partitions = adapters(host).config.service.partitions
    here = keys.partition_of(planner.root_session_id, partitions)
    strangers = {}
    for _ in range(200):
        other = await host.register_root("critic", "reviews", rules={})
        strangers.setdefault(keys.partition_of(other.root_session_id, partitions) == here, other)
        if len(strangers) == 2:
            break
    for stranger in strangers.values():
        for call in (host.obligations.inspect, host.obligations.cancel, host.obligations.retry):
            answer = await call(sent["message_id"], stranger.session_id)
            assert answer["error"]["code"] == "permission_denied", (call.__name__, answer)
    assert (await host.obligations.inspect(sent["message_id"], planner.session_id))["status"] == "pending"
