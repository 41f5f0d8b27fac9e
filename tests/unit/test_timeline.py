"""Mailbox time-travel, given/when/then: the streams the real deciders append, folded into steps.

Each test drives one session stream through the pure deciders (start, claim, consume, send records,
revert, fork) and checks what ``projections.timeline`` rebuilds from the events alone.
"""


from treemail.domain import events as ev
from treemail.domain import state as sm
from treemail.domain.commands import ClaimMail, ConsumeMail, FinishRun, ForkSession, RegisterSession, RevertSession, StartRun
from treemail.domain.decide.branches import decide_fork, decide_revert
from treemail.domain.decide.lifecycle import Given, decide_claim, decide_consume, decide_finish_run, decide_start_run
from treemail.projections.timeline import MAX_CHAIN, causal_chain, position_at_time, timeline, trace_id

from .builders import accepted, config, registered, tree

T = tree()
TRACE = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"


class Stream:
    """A session stream with its snapshot and mail hash kept as the live path keeps them."""

    def __init__(self, session_id: str, *events: ev.Event) -> None:
        self.session_id = session_id
        self.events: list[ev.Event] = []
        self.state = sm.INITIAL
        self.mail: dict[str, sm.MailItem] = {}
        self.now = 0.0
        self.append(list(events))

    @property
    def history(self) -> list[tuple[int, ev.Event]]:
        return list(enumerate(self.events, start=1))

    @property
    def version(self) -> int:
        return len(self.events)

    def append(self, new_events: list[ev.Event]) -> list[ev.Event]:
        self.now += 1.0
        new_events = [replace_at(e, self.now) for e in new_events]
        applied = sm.apply(self.state, self.mail, new_events, self.version)
        self.events.extend(new_events)
        self.state = applied.state
        for message_id, item in applied.mail_changes.items():
            if item is None:
                self.mail.pop(message_id, None)
            else:
                self.mail[message_id] = item
        return new_events

    def do(self, decide, command, with_history: bool = False) -> list[ev.Event]:
        given = Given(self.state, dict(self.mail), config(), self.now, tuple(self.history) if with_history else ())
        return self.append(decide(command, given))

    def run(self, run_id: str) -> None:
        self.do(decide_start_run, StartRun(self.session_id, run_id))

    def claim(self, run_id: str, step: int | None = None) -> list[str]:
        return [e.message_id for e in self.do(decide_claim, ClaimMail(self.session_id, run_id, step))
                if isinstance(e, ev.ProducerMessageClaimed)]

    def consume(self, message_id: str, step: int | None = None, tokens: int | None = None) -> None:
        self.do(decide_consume, ConsumeMail(self.session_id, message_id, step, tokens))

    def finish(self, run_id: str) -> None:
        self.do(decide_finish_run, FinishRun(self.session_id, run_id))

    def sent(self, message_id: str, to: str) -> None:
        self.append([ev.MessageSent(message_id=message_id, recipient_session_id=to, position=1,
                                    recipient_state="running")])


def replace_at(event: ev.Event, now: float) -> ev.Event:
    return event.model_copy(update={"at": now}) if event.at == 0.0 else event


def child() -> Stream:
    return Stream(T.child.session_id, registered(T.child, status="idle"))


def steps(tl) -> list[tuple[str, int, list[str], list[str], list[str]]]:
    return [(s.run_id, s.step, s.claimed, s.consumed, s.sent) for r in tl.runs for s in r.steps]


def histories(*streams: Stream) -> dict:
    return {s.session_id: s.history for s in streams}


def test_each_reported_step_lists_what_it_claimed_consumed_and_sent_in_order():
    s = child()
    s.append([accepted("m-1", T.root), accepted("m-2", T.sibling)])
    s.run("run-1")
    assert s.claim("run-1", step=3) == ["m-1", "m-2"]
    s.consume("m-2", step=3, tokens=40)
    s.consume("m-1", step=3, tokens=12)
    s.sent("out-1", T.root.session_id)
    s.append([accepted("m-3", T.root)])
    s.claim("run-1", step=4)
    s.consume("m-3", step=4)
    s.finish("run-1")

    tl = timeline(s.session_id, histories(s))

    assert steps(tl) == [("run-1", 3, ["m-1", "m-2"], ["m-2", "m-1"], ["out-1"]),
                         ("run-1", 4, ["m-3"], ["m-3"], [])]
    assert [st.reported for r in tl.runs for st in r.steps] == [True, True]
    assert tl.runs[0].steps[0].tokens == 52
    assert {m.message_id: (m.state, m.step) for m in tl.messages} == {
        "m-1": ("consumed", 3), "m-2": ("consumed", 3), "m-3": ("consumed", 4)}
    assert [t.kind for t in next(m for m in tl.messages if m.message_id == "m-2").lifecycle] == [
        "accepted", "admitted", "claimed", "consumed"]


def test_a_send_is_credited_once_where_it_was_first_recorded_a_peer_message_at_its_intent():
    s = child()
    s.append([accepted("m-1", T.root)])
    s.run("run-1")
    s.claim("run-1", step=1)
    s.consume("m-1", step=1)
    s.sent("out-1", T.root.session_id)
    s.append([ev.PeerIntentStored(message_id="peer-1", destination_session_id="advisor", peer="advisor",
                                  principal="acme", body="q?", mode="steer", run_id="run-1")])
    s.finish("run-1")
    s.run("run-2")
    # Later, in another run: the peer message's receipt at its admission, and the record a revert of the tree
    # message's recipient writes again. Neither is a send of run-2.
    s.append([ev.MessageSent(message_id="peer-1", recipient_session_id="advisor", position=4,
                             recipient_state="queued", peer="advisor")])
    s.sent("out-1", T.root.session_id)
    s.finish("run-2")

    tl = timeline(s.session_id, histories(s))

    assert steps(tl) == [("run-1", 1, ["m-1"], ["m-1"], ["out-1", "peer-1"])]
    assert tl.sent_outside_runs == []


def test_a_reported_step_that_claimed_nothing_is_still_a_step_so_a_runs_steps_can_be_counted():
    s = child()
    s.run("run-1")
    assert s.claim("run-1", step=1) == []
    s.append([accepted("m-1", T.root)])
    assert s.claim("run-1", step=2) == ["m-1"]
    s.consume("m-1", step=2)
    assert s.claim("run-1", step=3) == []
    assert s.claim("run-1", step=3) == []  # the same step reported again (a retried claim): still one step
    assert s.claim("run-1") == []  # no step reported and nothing claimed: nothing to record

    tl = timeline(s.session_id, histories(s))

    assert [type(e).__name__ for e in s.events].count("RunStepReported") == 3
    assert steps(tl) == [("run-1", 1, [], [], []), ("run-1", 2, ["m-1"], ["m-1"], []), ("run-1", 3, [], [], [])]
    assert all(st.reported for r in tl.runs for st in r.steps)


def test_without_reported_steps_each_claim_is_one_step_and_a_consume_joins_the_step_that_claimed_it():
    s = child()
    s.append([accepted("m-1", T.root), accepted("m-2", T.root)])
    s.run("run-1")
    s.claim("run-1")  # both at once: one boundary
    s.append([accepted("m-3", T.root)])
    s.claim("run-1")
    s.consume("m-3")
    s.consume("m-1")

    tl = timeline(s.session_id, histories(s))

    assert steps(tl) == [("run-1", 1, ["m-1", "m-2"], ["m-1"], []), ("run-1", 2, ["m-3"], ["m-3"], [])]
    assert [st.reported for r in tl.runs for st in r.steps] == [False, False]


def test_the_mailbox_at_an_earlier_position_is_the_mailbox_then():
    s = child()
    s.append([accepted("m-1", T.root)])
    s.run("run-1")
    s.claim("run-1", step=1)
    before = s.version
    s.consume("m-1", step=1)
    s.append([accepted("m-2", T.root)])

    then = timeline(s.session_id, histories(s), at=before)
    now = timeline(s.session_id, histories(s))

    assert {st: [m.message_id for m in ms] for st, ms in then.mailbox().items() if ms} == {"claimed": ["m-1"]}
    assert {st: [m.message_id for m in ms] for st, ms in now.mailbox().items() if ms} == {
        "pending": ["m-2"], "consumed": ["m-1"]}
    assert then.at == before and then.last == now.last == s.version
    assert position_at_time(s.history, s.events[before - 1].at) == before


def test_a_revert_marks_the_steps_it_took_back_and_the_restored_mail_is_pending_again():
    s = child()
    s.append([accepted("m-1", T.root), accepted("m-2", T.root)])
    s.run("run-1")
    s.claim("run-1", step=1)
    s.consume("m-1", step=1)
    cut = s.version
    s.consume("m-2", step=2)
    s.append([accepted("m-3", T.root)])
    s.claim("run-1", step=3)
    s.do(decide_revert, RevertSession(s.session_id, cut), with_history=True)
    revert_at = next(seq for seq, e in s.history if isinstance(e, ev.SessionReverted))
    s.run("run-2")
    s.claim("run-2", step=1)
    s.consume("m-2", step=1)

    tl = timeline(s.session_id, histories(s))

    by_key = {(st.run_id, st.step): st for r in tl.runs for st in r.steps}
    assert by_key[("run-1", 1)].reverted_by is None  # before the cut: still what the agent saw
    assert by_key[("run-1", 2)].reverted_by == revert_at
    assert by_key[("run-1", 3)].reverted_by == revert_at
    assert by_key[("run-2", 1)].reverted_by is None
    assert by_key[("run-2", 1)].claimed == ["m-2", "m-3"] and by_key[("run-2", 1)].consumed == ["m-2"]
    assert tl.reverts == [{"position": revert_at, "to_position": cut, "from_position": revert_at - 1}]
    kinds = [t.kind for t in next(m for m in tl.messages if m.message_id == "m-2").lifecycle]
    assert kinds == ["accepted", "admitted", "claimed", "consumed", "restored", "admitted", "claimed", "consumed"]
    # Scrubbed to just after the revert: m-2 is pending again, m-3 released by the run the revert ended.
    after = timeline(s.session_id, histories(s), at=revert_at + 3)
    assert {m.message_id: m.state for m in after.messages} == {"m-1": "consumed", "m-2": "pending",
                                                               "m-3": "pending"}


def test_a_fork_opens_with_the_steps_its_source_had_taken_by_the_fork_position_and_an_empty_mailbox():
    source = child()
    source.append([accepted("m-1", T.root), accepted("m-2", T.root)])
    source.run("run-1")
    source.claim("run-1", step=1)
    source.consume("m-1", step=1)
    at = source.version
    source.consume("m-2", step=2)
    registration = RegisterSession("fork-1", T.root.session_id, T.root.session_id, "explore", "fork", "explore_f0f0f0f0",
                                   [], True, "idle")
    fork = Stream("fork-1")
    fork.append(decide_fork(ForkSession(registration, source.session_id, at),
                            Given(sm.INITIAL, {}, config(), 9.0, tuple(source.history))))
    fork.run("run-f")
    fork.append([accepted("m-9", T.root)])
    fork.claim("run-f", step=2)

    tl = timeline("fork-1", histories(source, fork))

    assert tl.fork == {"source_session_id": source.session_id, "at_position": at}
    assert [(s.run_id, s.step, s.consumed, s.inherited_from) for r in tl.runs for s in r.steps] == [
        ("run-1", 1, ["m-1"], source.session_id), ("run-f", 2, [], None)]
    assert [m.message_id for m in tl.messages] == ["m-9"]
    # Without the source's history the fork still reads: its own steps only.
    assert [r.run_id for r in timeline("fork-1", histories(fork)).runs] == ["run-f"]


def test_a_causal_chain_walks_back_through_the_senders_runs_and_lists_the_trace():
    root = Stream(T.root.session_id, registered(T.root))
    kid = child()
    kid.append([accepted("ask", T.root).model_copy(update={"traceparent": TRACE, "run_id": "root-run"})])
    root.sent("ask", kid.session_id)
    kid.run("kid-run")
    kid.claim("kid-run", step=1)
    kid.consume("ask", step=1, tokens=7)
    kid.sent("answer", T.root.session_id)
    root.append([accepted("answer", T.child).model_copy(update={"traceparent": TRACE, "run_id": "kid-run"})])
    root.append([accepted("unrelated", T.sibling)])

    chain = causal_chain("answer", histories(root, kid))

    assert chain["trace_id"] == trace_id(TRACE) == "0af7651916cd43dd8448eb211c80319c"
    assert [(link["message"]["message_id"], link["caused_by"]) for link in chain["chain"]] == [
        ("answer", ["ask"]), ("ask", [])]
    assert chain["chain"][0]["sent_by_run"] == "kid-run"
    assert [m["message_id"] for m in chain["trace"]] == ["ask", "answer"]
    assert chain["chain"][1]["message"]["lifecycle"][-1]["tokens"] == 7
    assert causal_chain("nowhere", histories(root, kid)) == {}


def test_a_causal_chain_cut_at_its_bound_says_how_many_causes_it_did_not_follow():
    root = Stream(T.root.session_id, registered(T.root))
    kid = child()
    causes = [f"note-{n:02d}" for n in range(MAX_CHAIN + 6)]
    kid.append([accepted(mid, owner="plugin", mode="queue") for mid in causes])
    kid.run("kid-run")
    while kid.claim("kid-run"):
        pass
    for mid in causes:
        kid.consume(mid)
    kid.sent("answer", T.root.session_id)
    root.append([accepted("answer", T.child).model_copy(update={"run_id": "kid-run"})])

    chain = causal_chain("answer", histories(root, kid))

    assert chain["chain"][0]["caused_by"] == causes
    assert len(chain["chain"]) == MAX_CHAIN
    assert (chain["not_followed"], chain["max_chain"]) == (len(causes) - (MAX_CHAIN - 1), MAX_CHAIN) == (7, 64)
    assert causal_chain("note-00", histories(root, kid))["not_followed"] == 0


def test_an_older_stream_without_steps_and_an_unknown_event_still_fold():
    s = child()
    s.append([accepted("m-1", T.root)])
    s.run("run-1")
    s.append([ev.ProducerMessageClaimed(message_id="m-1", owner="agent", run_id="run-1")])
    s.append([ev.ProducerMessageConsumed(message_id="m-1", owner="agent", run_id="run-1")])
    s.append([ev.ToolsInstalled(tools=["interrupt_agent"])])

    tl = timeline(s.session_id, histories(s))

    assert steps(tl) == [("run-1", 1, ["m-1"], ["m-1"], [])]
    assert tl.to_json()["mailbox"]["consumed"] == ["m-1"]


def test_the_new_fields_are_written_only_when_reported():
    plain = ev.ProducerMessageConsumed(message_id="m", owner="agent", run_id="r")
    stepped = ev.ProducerMessageConsumed(message_id="m", owner="agent", run_id="r", step=2, tokens=30)
    assert "step" not in ev.encode(plain)[1] and "tokens" not in ev.encode(plain)[1]
    assert ev.decode(*ev.encode(stepped)) == stepped


def test_trees_nest_each_session_under_its_parent_and_a_session_without_a_listed_parent_is_a_root():
    from treemail.projections.mailboxes import trees

    rows = [{"session_id": sid, "parent_session_id": parent} for sid, parent in (
        ("a", None), ("a1", "a"), ("a2", "a"), ("a11", "a1"), ("b", None), ("orphan", "gone"))]

    nested = trees(rows)

    def shape(node):
        return (node["session_id"], [shape(child) for child in node["children"]])

    assert [shape(n) for n in nested] == [("a", [("a1", [("a11", [])]), ("a2", [])]), ("b", []), ("orphan", [])]


def test_a_delegation_deeper_than_the_trees_nest_goes_on_as_a_tree_of_its_own_and_loses_no_session():
    from treemail.projections.mailboxes import MAX_DEPTH, trees, walk

    chain = [f"s{n:03d}" for n in range(2 * MAX_DEPTH + 5)]
    rows = [{"session_id": sid, "parent_session_id": chain[n - 1] if n else None} for n, sid in enumerate(chain)]

    nested = trees(rows)

    assert [tree["session_id"] for tree in nested] == [chain[0], chain[MAX_DEPTH], chain[2 * MAX_DEPTH]]
    assert [row["session_id"] for tree in nested for _, row in walk(tree)] == chain
    assert max(depth for tree in nested for depth, _ in walk(tree)) == MAX_DEPTH - 1


def test_a_conversation_is_a_thread_with_each_reply_under_what_it_answers():
    root = Stream(T.root.session_id, registered(T.root))
    kid = child()

    def reply(message_id: str, sender, answers: str, thread: str) -> ev.ProducerMessageAccepted:
        return accepted(message_id, sender).model_copy(update={"in_reply_to": answers, "thread_id": thread})

    kid.append([accepted("ask", T.root)])
    root.sent("ask", kid.session_id)
    root.append([reply("answer", T.child, "ask", "ask")])
    kid.sent("answer", root.session_id)
    kid.append([accepted("other", T.root)])  # a message of its own thread, never answered
    root.sent("other", kid.session_id)
    kid.append([reply("follow-up", T.root, "ask", "ask")])
    root.sent("follow-up", kid.session_id)
    root.append([reply("thanks", T.child, "answer", "ask")])
    kid.sent("thanks", root.session_id)

    both = histories(root, kid)
    (thread,) = timeline(kid.session_id, both).threads
    assert thread.thread_id == "ask"
    assert [(p.message_id, p.depth, p.in_reply_to) for p in thread.posts] == [
        ("ask", 0, None), ("answer", 1, "ask"), ("thanks", 2, "answer"), ("follow-up", 1, "ask")]
    assert (thread.posts[1].sender_handle, thread.posts[1].recipient_handle) == (T.child.handle, T.root.handle)
    # The same conversation from the other side; and the mailbox marks each message with its thread.
    assert [p.message_id for p in timeline(root.session_id, both).threads[0].posts] == [
        p.message_id for p in thread.posts]
    assert {m.message_id: m.thread_id for m in timeline(kid.session_id, both).messages} == {
        "ask": "ask", "other": "other", "follow-up": "ask"}
    # Earlier, it was a question and its answer; with only its own stream, what it received.
    assert [p.message_id for p in timeline(kid.session_id, both, at=3).threads[0].posts] == ["ask", "answer"]
    assert [(p.message_id, p.depth) for p in timeline(kid.session_id, histories(kid)).threads[0].posts] == [
        ("ask", 0), ("follow-up", 1)]


def test_a_superseded_message_names_its_successor_and_every_cancel_asked_is_in_the_lifecycle():
    s = child()
    s.append([accepted("m-1", T.root), accepted("m-2", T.root)])
    s.append([ev.ProducerMessageDiscarded(message_id="m-1", owner="agent", sender_session_id=T.root.session_id,
                                          reason="superseded", superseded_by="m-2"),
              ev.MessageCancelAnswered(message_id="m-1", outcome="cancelled", by="sender", settled="superseded")])

    [old, new] = timeline(s.session_id, histories(s)).messages

    assert (old.state, old.reason, old.superseded_by, new.superseded_by) == ("discarded", "superseded", "m-2", None)
    assert [(t.kind, t.reason, t.by) for t in old.lifecycle][-2:] == [
        ("discarded", "superseded", None), ("cancel_answered", "cancelled", "sender")]
    assert old.state == "discarded"  # an answer changes nothing


def test_the_commands_default_listing_is_the_pages():
    from treemail.entrypoints.timeline_commands import DEFAULT_UI_SESSIONS
    from treemail.projections.mailboxes import MAX_SESSIONS

    assert DEFAULT_UI_SESSIONS == MAX_SESSIONS
