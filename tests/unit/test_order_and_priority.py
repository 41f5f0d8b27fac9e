"""Order and priority, rule by rule: per-pair numbers, claim order by (priority, position) within the
starvation bound, a pair held behind its own backoff, and the read receipt. Given/when/then on the pure domain."""

import dataclasses
import json
import random

from treemail.adapters import codec
from treemail.domain import events as ev
from treemail.domain import state as st
from treemail.domain.commands import ClaimMail, ClaimTurn, SendArguments, SendContext, SendMessage
from treemail.domain.decide import ordering
from treemail.domain.decide.lifecycle import decide_claim, decide_claim_turn
from treemail.domain.decide.send import Accepted, Refused, SendGiven, decide_send
from treemail.domain.errors import Code
from producers.tools import send_message as tool

from .builders import (
    CHILD_ID, History, accepted, claimed, config, consumed, discarded, found, given_lifecycle, registered,
    run_started, send, session_record, tree,
)

T = tree()


def numbered(message_id, sender, number, *, urgent=False, mode="steer"):
    return accepted(message_id, sender, mode=mode).model_copy(update={"pair_seq": number, "urgent": urgent})


def claim(h: History, bound: int = 8, now: float = 0.0) -> list[str]:
    events = decide_claim(ClaimMail(CHILD_ID, "run-1"), given_lifecycle(h, config(urgent_starvation_bound=bound), now))
    return [e.message_id for e in events]


# ---- per-pair numbers --------------------------------------------------------------------------


def test_each_directed_pair_counts_its_own_messages_from_one_where_they_land():
    # given a child that received two messages from the root and one from its sibling
    child = found(T.child, numbered("a", T.root, 1), numbered("b", T.root, 2), numbered("c", T.sibling, 1))
    # when the root and the grandchild send to it
    from_root = send(T.root, child, message_id="m-1", numbered=True)
    from_grandchild = send(T.grandchild, child, message_id="m-2", numbered=True)
    # then each send carries the next number of its own pair, in its event and its result
    assert isinstance(from_root, Accepted) and isinstance(from_grandchild, Accepted)
    assert from_root.result["sequence"] == 3 and from_root.events[-1].pair_seq == 3
    assert from_grandchild.result["sequence"] == 1
    # and the recipient's fold keeps the counter the next send reads
    assert st.fold([registered(T.child), *from_root.events]).pair_seq == {T.root.session_id: 3}


def test_urgent_never_passes_a_guard():
    # given a recipient whose inbox is full
    full = found(T.child, *[numbered(f"m{i}", T.sibling, i + 1) for i in range(2)])
    # when an urgent send arrives
    command = SendMessage("cmd", SendContext(T.root.session_id, "run-1", "call-1"),
                          SendArguments(to=T.child.handle, body="stop", urgent=True), "client")
    decision = decide_send(command, SendGiven(
        sender=T.root, sender_state=st.fold([registered(T.root), run_started()]), target=full,
        config=config(max_pending_per_session=2), new_id="m-9", now=1.0))
    # then it is refused like any other, nothing accepted
    assert isinstance(decision, Refused) and decision.code == Code.INBOX_FULL


def test_a_pair_counter_set_aside_keeps_its_numbers_increasing():
    # given a recipient that received and consumed one message from each of 40 senders, then the first again
    senders = [session_record(f"0190a000-0000-7000-8000-{i:012d}") for i in range(1000, 1040)]
    events = [registered(T.child)]
    for i, sender in enumerate(senders):
        events += [numbered(f"m{i}", sender, ordering.next_number(st.fold(events), sender.session_id)),
                   consumed(f"m{i}", sender)]
    state = st.fold(events)
    # then at most MAX_PAIR_COUNTERS counters are kept, the rest raised the floor
    assert len(state.pair_seq) == st.MAX_PAIR_COUNTERS and state.pair_seq_floor == 1
    # and the first sender, set aside, numbers its next message above every one it sent before
    first = senders[0].session_id
    assert first not in state.pair_seq and ordering.next_number(state, first) == 2
    # and its receipt says nothing of it is pending
    assert ordering.consumed_through(state, [], first) == 1


def test_a_pending_pair_counter_is_never_set_aside():
    senders = [session_record(f"0190a000-0000-7000-8000-{i:012d}") for i in range(2000, 2040)]
    events = [registered(T.child)]
    for i, sender in enumerate(senders):
        events.append(numbered(f"m{i}", sender, 1))  # none consumed: every pair has mail pending
    assert len(st.fold(events).pair_seq) == 40


# ---- claim order -------------------------------------------------------------------------------


def test_urgent_mail_is_claimed_first_and_each_priority_in_order():
    h = History(registered(T.child), run_started(), numbered("n1", T.root, 1), numbered("n2", T.sibling, 1),
                numbered("u1", T.root, 2, urgent=True), numbered("u2", T.sibling, 2, urgent=True))
    assert claim(h) == ["u1", "u2", "n1", "n2"]


def test_the_starvation_bound_is_reached_and_held():
    # given a normal message, then twelve urgent ones sent after it
    urgent = [numbered(f"u{i}", T.sibling, i + 1, urgent=True) for i in range(12)]
    h = History(registered(T.child), run_started(), numbered("n", T.root, 1), *urgent)
    # then exactly eight pass it, never a ninth
    assert claim(h, bound=8) == [f"u{i}" for i in range(8)] + ["n"] + [f"u{i}" for i in range(8, 12)]
    assert claim(h, bound=3) == ["u0", "u1", "u2", "n", *[f"u{i}" for i in range(3, 12)]]
    # and with the bound at 0 priority never passes anything: acceptance order
    assert claim(h, bound=0) == ["n", *[f"u{i}" for i in range(12)]]


def test_an_urgent_steer_joins_the_boundary_ahead_of_queued_chatter_but_queued_mail_waits_for_a_turn():
    chatter = [numbered(f"c{i}", T.sibling, i + 1, mode="queue") for i in range(5)]
    h = History(registered(T.child), run_started(), *chatter, numbered("u", T.root, 1, urgent=True))
    # at a step boundary only the steer is due
    assert claim(h) == ["u"]
    # at a new turn the urgent steer still comes first, the chatter in order after it
    turn = decide_claim_turn(ClaimTurn(CHILD_ID, "run-1"), given_lifecycle(h))
    assert [e.message_id for e in turn] == ["u", *[f"c{i}" for i in range(5)]]


def test_no_normal_message_is_ever_passed_by_more_than_the_bound():
    rng = random.Random(7)
    for _ in range(300):
        bound = rng.randrange(0, 6)
        items = [st.MailItem(f"m{i}", "agent", "s", 0, "steer", "accepted", None, i, urgent=rng.random() < 0.6)
                 for i in range(rng.randrange(1, 30))]
        ordered = ordering.claim_order(rng.sample(items, len(items)), bound)
        assert sorted(m.seq for m in ordered) == [m.seq for m in items]  # nothing lost or doubled
        for index, item in enumerate(ordered):
            ahead = ordered[:index]
            # each priority keeps acceptance order
            assert all(m.seq < item.seq for m in ahead if m.urgent == item.urgent)
            if not item.urgent:
                assert sum(1 for m in ahead if m.urgent and m.seq > item.seq) <= bound


def test_a_pair_waits_behind_its_own_message_backing_off():
    # given the root's first message failed an attempt and backs off until t=10, its second is due
    first = claimed("a", T.root)
    release = ev.ProducerMessageReleased(message_id="a", owner="agent", sender_session_id=T.root.session_id,
                                         agent_hop=0, run_id="run-1", retry_at=10.0)
    h = History(registered(T.child), run_started(), numbered("a", T.root, 1), first, release,
                numbered("b", T.root, 2), numbered("c", T.sibling, 1))
    # then before t=10 neither of the root's is claimed, the sibling's is
    assert claim(h, now=5.0) == ["c"]
    # and once the backoff is over both come, in the pair's order
    assert claim(h, now=10.0) == ["a", "b", "c"]


# ---- the read receipt --------------------------------------------------------------------------


def receipt(h: History, sender) -> int:
    """The read receipt as the host reads it: the numbers on the accepted events of the pair's pending mail."""
    numbers = [h.events[position].pair_seq for position in ordering.pending_from(h.mail, sender.session_id)]
    return ordering.consumed_through(h.state, numbers, sender.session_id)


def test_the_read_receipt_is_one_below_the_lowest_number_pending():
    h = History(registered(T.child), run_started(), *[numbered(f"m{i}", T.root, i) for i in range(1, 5)],
                claimed("m1", T.root), consumed("m1", T.root), discarded("m2", T.root), claimed("m4", T.root),
                consumed("m4", T.root))
    # m1 consumed, m2 discarded (never to be read), m3 pending, m4 consumed after it
    assert ordering.sent_through(h.state, T.root.session_id) == 4
    assert receipt(h, T.root) == 2
    h.then([claimed("m3", T.root), consumed("m3", T.root)])
    assert receipt(h, T.root) == 4
    # a sender that never sent anything has read receipt 0
    assert receipt(h, T.sibling) == 0


# ---- the surfaces ------------------------------------------------------------------------------


def test_the_default_send_message_schema_has_no_urgent_and_refuses_it():
    plain = tool.tool_definition([("*", "allow")])
    assert "urgent" not in plain["input_schema"]["properties"]
    assert tool.tool_definition([("*", "allow")], urgent=True)["input_schema"]["properties"]["urgent"]["type"] == "boolean"
    try:
        tool.parse_arguments({"to": "x", "body": "y", "urgent": True})
    except Exception as refused:
        assert refused.code == Code.INVALID_ARGUMENTS
    else:
        raise AssertionError("urgent parsed where the host did not enable it")
    assert tool.parse_arguments({"to": "x", "body": "y", "urgent": True}, urgent=True).urgent is True


def test_urgent_rides_the_command_and_the_mail_item():
    command = SendMessage("cmd", SendContext(T.root.session_id, "run-1", "call-1"),
                          SendArguments(to="x", body="y", urgent=True), "client")
    assert codec.parse_command(codec.encode_command(command)).arguments.urgent is True
    plain = dataclasses.replace(command, arguments=SendArguments(to="x", body="y"))
    assert "u" not in json.loads(codec.encode_command(plain))  # a normal send is encoded as before
    item = st.MailItem("m", "agent", "s", 0, "steer", "accepted", None, 5, urgent=True)
    assert st.MailItem.from_json("m", item.to_json()) == item


def test_a_message_held_behind_its_pair_is_no_failed_attempt_and_wakes_nobody_before_its_elder_is_due():
    from treemail.domain.commands import FinishRun
    from treemail.domain.decide.lifecycle import decide_finish_run

    release = ev.ProducerMessageReleased(message_id="a", owner="agent", sender_session_id=T.root.session_id,
                                         agent_hop=0, run_id="run-1", retry_at=10.0)
    h = History(registered(T.child), run_started(), numbered("a", T.root, 1), claimed("a", T.root), release,
                numbered("b", T.root, 2), numbered("c", T.sibling, 1))
    assert claim(h, now=5.0) == ["c"]
    h.then([claimed("c", T.sibling), consumed("c", T.sibling)])
    finished = decide_finish_run(FinishRun(CHILD_ID, "run-1"), given_lifecycle(h, now=5.0))
    # b was held by a's backoff: the run ending is no failed attempt of it, and no wake is asked for it; as steer
    # mail the run did not take, it falls back to queue on the record (flow control), which is no attempt either
    assert [(type(e).__name__, getattr(e, "message_id", None)) for e in finished] == [
        ("ProducerMessageSteerFellBack", "b"), ("SessionRunFinished", None)]
    # and the pump looks again when a's backoff ends, not before
    from treemail.domain.decide.delivery import next_check
    h.then(finished)
    assert next_check(h.state, h.mail.values(), config(), 5.0) == 10.0
