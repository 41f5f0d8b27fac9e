"""Causation and loop detection: the similarity rule, the chain every message joins, the refusal of a ping-pong
with no new content, and the one notice its nearest common ancestor gets. Pure."""

from treemail.domain import events as ev
from treemail.domain import loops
from treemail.domain import state as st
from treemail.domain.commands import SendArguments, SendContext, SendMessage
from treemail.domain.decide.guards import Found
from treemail.domain.decide.send import Accepted, Refused, SendGiven, decide_send
from treemail.domain.errors import Code
from treemail.domain.outbound import Sender

from .builders import History, config, consumed, registered, run_started, tree


# ---- the similarity rule ---------------------------------------------------------------------------


def test_near_duplicate_bodies_are_similar_and_new_content_is_not():
    assert loops.similar(loops.fingerprint("Ok, thanks!"), loops.fingerprint("thanks ok"))
    assert loops.similar(loops.fingerprint("Got it, thanks. Standing by."),
                         loops.fingerprint("got it -- thanks, standing by"))
    assert not loops.similar(loops.fingerprint("round 2 result for shard 17: 3310 rows"),
                             loops.fingerprint("round 3 result for shard 17: 4821 rows"))
    assert not loops.similar(loops.fingerprint("thanks"), loops.fingerprint("the parser fails on empty input"))


def test_a_fingerprint_is_bounded_whatever_the_body():
    body = " ".join(f"word{i}" for i in range(10_000))
    assert len(loops.fingerprint(body)) <= loops.SKETCH_SIZE
    assert loops.fingerprint(body) == loops.fingerprint(body[:loops.PREFIX_CHARS] + " other words after")


def test_the_streak_counts_repeats_within_one_chain_only():
    first = loops.next_mark(None, "c1", "ok thanks")
    second = loops.next_mark(first, "c1", "thanks, ok")
    assert (first.streak, second.streak) == (0, 1)
    assert loops.next_mark(second, "c2", "ok thanks").streak == 0
    assert loops.next_mark(second, "c1", "here is the stack trace you asked for").streak == 0


def test_the_nearest_common_ancestor_of_two_lines():
    assert loops.common_ancestor(["a", "p", "r"], ["b", "p", "r"]) == "p"
    assert loops.common_ancestor(["a", "p", "r"], ["b", "q", "r"]) == "r"
    assert loops.common_ancestor(["a"], ["b"]) is None


# ---- a conversation through the pure decider -----------------------------------------------------------


class Talk:
    """Sessions whose streams grow as they send to each other; each recipient consumes what it gets in its run
    before it answers (its run's next message is caused by it)."""

    def __init__(self, *records):
        self.records = {r.session_id: r for r in records}
        self.streams = {r.session_id: History(registered(r), run_started(f"run-{r.session_id}")) for r in records}
        self.calls = 0

    def send(self, sender, recipient, body: str, ancestor=None):
        self.calls += 1
        run = f"run-{sender.session_id}"
        command = SendMessage("cmd", SendContext(sender.session_id, run, f"call-{self.calls}"),
                              SendArguments(to=recipient.handle, body=body, mode="steer"), "client")

        def given(ancestor_sender):
            return SendGiven(sender=sender, sender_state=self.streams[sender.session_id].state,
                             target=Found(recipient, self.streams[recipient.session_id].state), config=config(),
                             new_id=f"m-{self.calls}", now=float(self.calls), ancestor=ancestor_sender,
                             ancestor_looked=ancestor_sender is not None)

        decision = decide_send(command, given(None))
        if isinstance(decision, Refused) and decision.ancestor_wanted:
            kept = self.streams[ancestor.session_id]
            decision = decide_send(command, given(Sender(ancestor, kept.state, len(kept.events))))
        if isinstance(decision, Accepted):
            self.streams[recipient.session_id].then(decision.events)
            self.streams[recipient.session_id].then(
                [consumed(f"m-{self.calls}", sender, run_id=f"run-{recipient.session_id}")])
        else:
            self.streams[recipient.session_id].then(decision.events)
        for source in decision.sources:
            self.streams[source.record.session_id].then(source.events)
        return decision

    def notices(self, session_id: str) -> list[ev.ProducerMessageAccepted]:
        return [e for e in self.streams[session_id].events
                if isinstance(e, ev.ProducerMessageAccepted) and e.owner == "loop"]


def test_every_message_records_its_cause_and_its_chain():
    t = tree()
    talk = Talk(t.root, t.child)
    first = talk.send(t.root, t.child, "please look at src/")
    answer = talk.send(t.child, t.root, "src/ has three modules")
    started, replied = first.events[-1], answer.events[-1]
    assert (started.caused_by, started.chain_id, started.chain_of) == (None, None, "m-1")
    assert (replied.caused_by, replied.chain_of) == ("m-1", "m-1")
    again = talk.send(t.root, t.child, "now read the tests")
    assert (again.events[-1].caused_by, again.events[-1].chain_of) == ("m-2", "m-1")


def test_a_parent_child_ping_pong_with_no_new_content_is_refused_in_its_third_exchange_and_noticed_once():
    t = tree()
    talk = Talk(t.root, t.child)
    talk.send(t.root, t.child, "Please summarise the failing test.")
    outcomes = []
    for turn in range(8):
        outcomes.append(talk.send(t.child, t.root, "Thanks, acknowledged!"))
        outcomes.append(talk.send(t.root, t.child, "Acknowledged, thanks."))
    codes = [o.code if isinstance(o, Refused) else "ok" for o in outcomes]
    first_refusal = codes.index(Code.LOOP_DETECTED)
    assert first_refusal == 4  # the child's third message: the third exchange (two messages each)
    assert all(code == Code.LOOP_DETECTED for code in codes[first_refusal:])
    # The root is the nearest common ancestor of a parent and its child: one notice, however often refused.
    notices = talk.notices(t.root.session_id)
    assert len(notices) == 1 and notices[0].chain_id == "m-1"
    assert "loop_detected" in notices[0].body
    # It names both sessions by handle and by id: a handle is what agents address, the id what a debugger
    # looks up.
    for looping in (t.root, t.child):
        assert f"{looping.handle} (session {looping.session_id})" in notices[0].body
    assert talk.notices(t.child.session_id) == []
    refused = [e for e in talk.streams[outcomes[first_refusal].sources[0].record.session_id].events
               if isinstance(e, ev.MessageRefused)]
    assert refused and refused[0].code == Code.LOOP_DETECTED.value


def test_siblings_looping_are_refused_and_their_parent_gets_the_notice():
    t = tree()
    talk = Talk(t.root, t.child, t.sibling)
    talk.send(t.root, t.child, "Coordinate with review on the API.")
    talk.send(t.child, t.sibling, "What do you think of the API?")
    codes = []
    for _ in range(4):
        codes.append(talk.send(t.sibling, t.child, "Looks good to me!", ancestor=t.root))
        codes.append(talk.send(t.child, t.sibling, "Great, looks good to me too!", ancestor=t.root))
    assert Code.LOOP_DETECTED in [getattr(c, "code", None) for c in codes]
    assert len(talk.notices(t.root.session_id)) == 1
    assert talk.notices(t.child.session_id) == talk.notices(t.sibling.session_id) == []


def test_a_conversation_with_new_content_is_never_refused():
    t = tree()
    talk = Talk(t.root, t.child)
    talk.send(t.root, t.child, "Count the rows of every shard.")
    for round_ in range(12):
        report = talk.send(t.child, t.root, f"Round {round_}: shard {round_ * 7} holds {1000 + round_ * 37} rows")
        answer = talk.send(t.root, t.child, "Thanks, continue with the next shard.")
        assert isinstance(report, Accepted) and isinstance(answer, Accepted)


def test_one_side_repeating_while_the_other_says_something_new_is_not_a_loop():
    t = tree()
    talk = Talk(t.root, t.child)
    talk.send(t.root, t.child, "Start.")
    for i in range(10):
        assert isinstance(talk.send(t.child, t.root, f"finding {i}: module m{i} imports m{i + 1} twice"), Accepted)
        assert isinstance(talk.send(t.root, t.child, "ok"), Accepted)


def test_the_memory_the_rule_needs_is_bounded_and_survives_the_snapshot():
    t = tree()
    state = st.INITIAL
    for i in range(loops.MAX_MARKS + 20):
        state = st.evolve(state, ev.ProducerMessageAccepted(
            message_id=f"m-{i}", owner="agent", sender_session_id=f"s-{i}", body="hello there", mode="steer",
            chain_id=f"c-{i}"))
    assert len(state.loop_marks) == loops.MAX_MARKS
    assert st.SessionState.from_json(state.to_json()) == state
    for i in range(loops.MAX_MARKS + 20):
        state = st.evolve(state, consumed(f"m-{i}", t.child, run_id=f"run-{i}"))
    assert len(state.run_causes) == loops.MAX_RUN_CAUSES and state.chains == {}
    assert st.SessionState.from_json(state.to_json()) == state


def test_a_ping_pong_whose_first_message_starts_the_chain_is_refused_at_its_sixth_message():
    t = tree()
    talk = Talk(t.root, t.child)
    codes = []
    for _ in range(4):
        for sender, recipient in ((t.child, t.root), (t.root, t.child)):
            outcome = talk.send(sender, recipient, "Thanks, all good here!")
            codes.append(outcome.code if isinstance(outcome, Refused) else "ok")
    assert codes.index(Code.LOOP_DETECTED) == 5  # the root's third message, in the third exchange
    assert len(talk.notices(t.root.session_id)) == 1
