"""The recipient's snapshot (rewritten on every append) stays small however many agents ever wrote to it."""

from treemail.domain import events as ev
from treemail.domain.decide.guards import Found
from treemail.domain.state import MAX_PRODUCERS, evolve, fold

from .builders import consumed, registered, send, session_record, tree

T = tree()


def senders(n: int):
    return [session_record(f"0190a000-0000-7000-8000-{i:012d}", root=T.root.session_id, parent=T.root.session_id)
            for i in range(100, 100 + n)]


class Recipient:
    """T.child's state, folded one decided send (and its consumption) at a time."""

    def __init__(self) -> None:
        self.state = fold([registered(T.child)])
        self.sent = 0

    def receive(self, sender) -> list[type]:
        self.sent += 1
        decision = send(sender, Found(T.child, self.state), message_id=f"m-{self.sent}", tool_call_id=f"c-{self.sent}")
        for event in [*decision.events, consumed(f"m-{self.sent}", sender)]:
            self.state = evolve(self.state, event)
        return [type(e) for e in decision.events if not isinstance(e, ev.SessionWakeRequested)]


def test_a_thousand_senders_leave_a_snapshot_of_bounded_size():
    # given a recipient that received and consumed one message from each of 1,000 different agents
    child = Recipient()
    for sender in senders(1000):
        child.receive(sender)
    # then its snapshot keeps no pair entry at 0 and at most MAX_PRODUCERS producers
    assert child.state.pair_inflight == {} and child.state.pending_agent == 0
    assert len(child.state.producers) == MAX_PRODUCERS
    assert len(child.state.to_json()) < 6000  # it was 86 KB at 1,000 senders


def test_a_sender_that_keeps_writing_stays_registered_and_a_forgotten_one_registers_again():
    child = Recipient()
    regular, *crowd = senders(MAX_PRODUCERS + 1)
    assert child.receive(regular) == [ev.ProducerRegistered, ev.ProducerMessageAccepted]
    for n, sender in enumerate(crowd):
        assert child.receive(sender) == [ev.ProducerRegistered, ev.ProducerMessageAccepted]
        if n % 8 == 0:
            assert child.receive(regular) == [ev.ProducerMessageAccepted]
    # MAX_PRODUCERS others wrote since crowd[0] last did: it is registered anew; the regular one is not.
    assert child.receive(regular) == [ev.ProducerMessageAccepted]
    assert child.receive(crowd[0]) == [ev.ProducerRegistered, ev.ProducerMessageAccepted]
