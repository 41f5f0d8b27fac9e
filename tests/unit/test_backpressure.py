"""Typed backpressure: the pace a session is seen to drain at, and the retry-after and occupancy a refusal that
may pass later carries (structured and in the text), kept by its idempotency record. Pure."""

from treemail.domain import flow
from treemail.domain import state as st
from treemail.domain.decide import idempotency
from treemail.domain.decide.send import Refused, outcome_of
from treemail.domain.errors import Code

from .builders import accepted, config, consumed, found, registered, send, tree

T = tree()


def at(event, t: float):
    return event.model_copy(update={"at": t})


def paced(pace: flow.Pace, times) -> flow.Pace:
    for t in times:
        pace = flow.observe(pace, t)
    return pace


def test_the_pace_is_seconds_per_drained_slot_over_windows_of_time_not_per_event():
    # A claim's batch consumed within milliseconds, every 2 s: 4 messages per 2 s is 0.5 s a message.
    times = [base + i * 0.001 for base in (10.0, 12.0, 14.0, 16.0) for i in range(4)]
    pace = paced(flow.NOTHING, times)
    assert abs(flow.seconds_per_slot(pace) - 0.5) < 0.01


def test_nothing_observed_yet_gives_the_fallback_and_an_idle_gap_is_not_pace():
    cfg = config(retry_after_fallback_ms=1500)
    assert flow.retry_after_ms(flow.NOTHING, 3, cfg) == 1500
    assert flow.retry_after_ms(paced(flow.NOTHING, [5.0]), 3, cfg) == 1500  # one drain is no pace yet
    steady = paced(flow.NOTHING, [0.0, 1.0, 2.0, 3.0])
    assert flow.seconds_per_slot(paced(steady, [10_000.0])) == flow.seconds_per_slot(steady)


def test_retry_after_is_the_slots_to_free_times_the_pace_within_the_bounds():
    pace = paced(flow.NOTHING, [0.0, 2.0, 4.0])  # 2 s a slot
    assert flow.retry_after_ms(pace, 3, config()) == 6000
    assert flow.retry_after_ms(pace, 3, config(retry_after_max_ms=5000)) == 5000
    assert flow.retry_after_ms(paced(flow.NOTHING, [0.0, 1.0, 1.001, 2.0, 2.001]), 1,
                               config(retry_after_min_ms=800)) == 800


def full_inbox(pace_times=(), limit=2):
    senders = [T.sibling, T.grandchild]
    events = [registered(T.child)] + [accepted(f"m-{i}", senders[i % 2]) for i in range(limit)]
    # Earlier mail consumed at the recipient's own pace, one message every 1.5 s.
    for i, t in enumerate(pace_times):
        events += [at(accepted(f"old-{i}", T.sibling), t), at(consumed(f"old-{i}", T.sibling), t)]
    return found(T.child, *events)


def test_inbox_full_carries_retry_after_from_the_recipients_consumption_and_its_occupancy():
    cfg = config(max_pending_per_session=2, max_inflight_per_pair=0)
    decision = send(T.root, full_inbox(pace_times=[0.0, 1.5, 3.0, 4.5]), cfg=cfg)
    assert isinstance(decision, Refused) and decision.code is Code.INBOX_FULL
    error = outcome_of(decision)["error"]
    assert error["retry_after_ms"] == 1500 and error["occupancy"] == {"pending": 2, "limit": 2}
    default = "the recipient already has 2 unread agent messages (limit 2); try again later"
    assert error["message"] == default + " (retry after 1.5 s: 2 of 2 pending)"
    # A recipient never seen consuming: the fallback.
    fresh = outcome_of(send(T.root, full_inbox(), cfg=cfg))["error"]
    assert fresh["retry_after_ms"] == cfg.retry_after_fallback_ms


def test_a_retried_call_is_answered_with_the_recorded_wait_whatever_the_pace_is_now():
    cfg = config(max_pending_per_session=2, max_inflight_per_pair=0)
    first = outcome_of(send(T.root, full_inbox(pace_times=[0.0, 1.5, 3.0, 4.5]), cfg=cfg))
    recorded = idempotency.record(send_args(), first)
    again = send(T.root, full_inbox(pace_times=[0.0, 9.0, 18.0]), cfg=cfg, recorded=recorded)
    assert outcome_of(again) == first and first["error"]["retry_after_ms"] == 1500


def send_args():
    from treemail.domain.commands import SendArguments
    return SendArguments(to="explore_00000002", body="hello", mode="steer")


def test_a_full_pair_window_counts_the_other_senders_mail_ahead_of_it():
    cfg = config(max_pending_per_session=32, max_inflight_per_pair=2)
    events = [registered(T.child), accepted("a-1", T.root), accepted("a-2", T.root), accepted("b-1", T.sibling)]
    for i, t in enumerate([0.0, 2.0, 4.0]):
        events += [at(accepted(f"old-{i}", T.sibling), t), at(consumed(f"old-{i}", T.sibling), t)]
    error = outcome_of(send(T.root, found(T.child, *events), cfg=cfg))["error"]
    assert error["code"] == Code.INFLIGHT_FULL.value
    assert error["occupancy"] == {"in_flight": 2, "window": 2}
    assert error["retry_after_ms"] == 4000  # the sibling's one message, then the pair's oldest: 2 slots of 2 s
    assert error["message"].endswith("(retry after 4.0 s: 2 of 2 in flight to this recipient)")


def test_refusals_that_do_not_pass_by_waiting_carry_no_retry_after():
    decision = send(T.child, found(T.child))
    assert decision.code is Code.SELF_SEND and "retry_after_ms" not in outcome_of(decision)["error"]


def test_the_pace_survives_the_snapshot():
    state = st.fold([registered(T.child), *(e for i, t in enumerate([0.0, 1.0, 2.0])
                                           for e in (at(accepted(f"m{i}", T.root), t), at(consumed(f"m{i}", T.root), t)))])
    assert state.consumed_pace != flow.NOTHING
    assert st.SessionState.from_json(state.to_json()) == state


def settled(message_id: str, t: float):
    from treemail.domain import events as ev
    return ev.MessageSettled(at=t, message_id=message_id, recipient_session_id="r", outcome="consumed")


def sent(message_id: str, t: float):
    from treemail.domain import events as ev
    return ev.MessageSent(at=t, message_id=message_id, recipient_session_id="r", position=3, recipient_state="idle")


def test_source_capacity_waits_at_the_pace_the_senders_own_mail_was_settled():
    from .builders import run_started
    history = [registered(T.root), run_started("run-1")]
    history += [e for i, t in enumerate([0.0, 3.0, 6.0]) for e in (sent(f"old-{i}", t), settled(f"old-{i}", t))]
    history += [sent(f"m-{i}", 7.0) for i in range(2)]
    decision = send(T.root, found(T.child), sender_events=tuple(history), cfg=config(max_outstanding_per_source=2))
    error = outcome_of(decision)["error"]
    assert error["code"] == Code.SOURCE_CAPACITY.value
    assert (error["retry_after_ms"], error["occupancy"]) == (3000, {"unsettled": 2, "limit": 2})
    assert error["message"].endswith("(retry after 3.0 s: 2 of 2 unsettled)")


def test_a_full_peer_outbox_and_a_drain_carry_a_wait_too():
    from treemail.domain.commands import PeerSendArguments, SendContext, SendToPeer
    from treemail.domain.decide.send import SendGiven
    from treemail.domain.handlers import HANDLERS
    from .test_peer_outbox import ADVISOR, GRANT, PLANNER, ROUTE, intent, source

    state = source(intent("m-1"), intent("m-2"))
    command = SendToPeer(SendContext(PLANNER.session_id, "run-1", "call-9"), PeerSendArguments("advisor", "hi"))
    given = SendGiven(sender=PLANNER, sender_state=state, target=found(ADVISOR, ROUTE, GRANT),
                      config=config(max_pending_peer_deliveries=2), new_id="m-3", now=10.0)
    error = outcome_of(HANDLERS[SendToPeer].decide(command, given))["error"]
    assert error["code"] == Code.PEER_OUTBOX_FULL.value and error["occupancy"] == {"pending": 2, "limit": 2}
    assert error["message"].endswith("(retry after 1.0 s: 2 of 2 waiting to be delivered)")

    draining = outcome_of(send(T.root, full_inbox(), cfg=config(retry_after_max_ms=45000), service_draining=True))
    assert draining["error"]["code"] == Code.DRAINING.value
    assert (draining["error"]["retry_after_ms"], draining["error"]["occupancy"]) == (45000, {"draining": "service"})
