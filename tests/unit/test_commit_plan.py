"""One write path per decision: the send decision returns every event it writes, the sender's own records
included, and the pure commit plan says what the atomic step writes beside them (snapshot, mail placement,
wakes, due index, the sender's outbound entries). Given/when/then, no store."""

from treemail.domain import events as ev
from treemail.domain import proof
from treemail.domain import state as st
from treemail.domain.commands import SendArguments, SendContext, SendMessage
from treemail.domain.commitplan import Idempotency, Source, plan_commit
from treemail.domain.decide.send import Accepted, Refused, SendGiven, decide_send, outcome_of
from treemail.domain.errors import Code

from .builders import History, accepted, claimed, config, consumed, found, registered, run_started, send, tree

T = tree()
CFG = config()  # 30 s attempts, backoff 1..60 s, 24 h deadline


def running_child() -> History:
    return History(registered(T.child, status="running"), run_started("run-1"))


def idle_child() -> History:
    return History(registered(T.child, status="idle"))


def sender_state() -> st.SessionState:
    return st.fold([registered(T.root), run_started("run-1")])


def decide(**given):
    """The root's send to its idle child, decided on ``given`` (``SendGiven``'s fields)."""
    command = SendMessage("cmd-1", SendContext(T.root.session_id, "run-1", "call-1"),
                          SendArguments(to=T.child.handle, body="hi"), "client-1")
    return decide_send(command, SendGiven(
        sender=T.root, sender_state=sender_state(), target=found(T.child, registered(T.child, status="idle")),
        config=CFG, new_id="m-1", now=1.0, **given,
    ))


# ---- the decision returns the sender's records ---------------------------------------------------


def test_an_accepted_send_returns_the_senders_receipt_at_the_messages_position_on_the_recipients_stream():
    decision = decide(target_version=7)

    assert isinstance(decision, Accepted)
    [receipt] = decision.sender_events
    assert isinstance(receipt, ev.MessageSent)
    # The sender's first message to it registers its producer first: the message is the recipient's 9th event.
    assert [type(e).__name__ for e in decision.events[:2]] == ["ProducerRegistered", "ProducerMessageAccepted"]
    assert (receipt.message_id, receipt.recipient_session_id, receipt.position) == ("m-1", T.child.session_id, 9)
    assert receipt.recipient_state == "queued"


def test_a_refusal_decided_on_the_recipients_state_is_recorded_by_the_sender_under_its_own_message_id():
    full = config(max_pending_per_session=1)
    recipient = found(T.child, registered(T.child), accepted("m-0", T.sibling))

    decision = send(T.root, recipient, cfg=full, message_id="m-9")

    assert isinstance(decision, Refused) and decision.code is Code.INBOX_FULL
    [record] = decision.sender_events
    assert record == ev.MessageRefused(at=1.0, message_id="m-9", recipient_session_id=T.child.session_id,
                                       code=Code.INBOX_FULL.value)
    assert outcome_of(decision)["error"]["message_id"] == "m-9"


def test_a_refusal_of_the_call_alone_records_nothing_on_the_sender_and_keeps_no_message_id():
    decision = send(T.root, found(T.root))  # to itself

    assert isinstance(decision, Refused) and decision.code is Code.SELF_SEND
    assert decision.sender_events == [] and "message_id" not in outcome_of(decision)["error"]


def test_the_decision_signs_the_accepted_message_for_its_recipient_when_proofs_are_on():
    keyring = proof.Keyring("k1", {"k1": b"secret"})

    signed, unsigned = decide(keyring=keyring), decide()

    message = next(e for e in signed.events if isinstance(e, ev.ProducerMessageAccepted))
    assert proof.verify(message, T.child.session_id, keyring) == "ok"
    assert all(getattr(e, "proof", None) is None for e in unsigned.events)


# ---- the commit plan ---------------------------------------------------------------------------------


def test_a_send_plans_the_recipients_events_and_mail_and_the_senders_records_in_one_step():
    h = idle_child()
    decision = send(T.root, found(T.child, *h.events))
    kept = Idempotency(T.root.session_id, "digest", ["fp", "m-1", "steer", "queued"])

    plan = plan_commit(
        T.child, h.state, 1, decision.events, folded=decision.state_after, new_mail=("m-1",),
        sources=[Source(T.root, sender_state(), 2, decision.sender_events)], idempotency=kept, read_draining=False,
    )

    assert plan.events == decision.events and plan.applied.version == 1 + len(decision.events)
    assert plan.applied.state == st.fold(decision.events, h.state)
    # A new steer is claimable at once: kept in the due hash, which does not hold it yet.
    [(message_id, item, where)] = plan.mail
    assert (message_id, item.state, where) == ("m-1", "accepted", "new due")
    # The idle recipient is woken in the same step.
    assert [message_id for _, message_id in plan.applied.wakes] == ["m-1"]
    [source] = plan.sources
    assert source.events == decision.sender_events
    assert source.state.outstanding == sender_state().outstanding + 1
    assert source.outbound == ["m-1", f"{T.root.session_id} 3"]  # the receipt is the sender's third event
    assert (plan.idempotency, plan.read_draining) == (kept, False)


def test_a_queued_message_is_held_and_a_done_one_leaves_both_hashes():
    h = running_child()
    queued = accepted("m-1", T.root, mode="queue")

    plan = plan_commit(T.child, h.state, 2, [queued], new_mail=("m-1",))
    assert [(m, where) for m, _, where in plan.mail] == [("m-1", "new held")]

    h.then([queued])
    claim = claimed("m-1", T.root)
    plan = plan_commit(T.child, h.state, 3, [claim, consumed("m-1", T.root)], mail=h.mail)
    assert plan.mail == [("m-1", None, "")]


def test_the_due_index_is_exact_with_all_the_mail_lowered_with_part_of_it_and_untouched_without_a_policy():
    h = idle_child()
    message = accepted("m-1", T.root, mode="queue").model_copy(update={"at": 100.0})

    assert plan_commit(T.child, h.state, 1, [message], now=100.0).due == ("", None)
    # Mail due while asleep and no wake outstanding: the pump must act now.
    assert plan_commit(T.child, h.state, 1, [message], policy=CFG, now=100.0).due == ("lt", 100.0)
    assert plan_commit(T.child, h.state, 1, [message], mail={}, mail_complete=True, policy=CFG,
                       now=100.0).due == ("set", 100.0)
    # Nothing pending once all mail is known: the session leaves the index.
    assert plan_commit(T.child, h.state, 1, [ev.SessionStatusChanged(status="finished")], mail={},
                       mail_complete=True, policy=CFG, now=100.0).due == ("del", None)


def test_a_plan_is_a_pure_function_of_what_it_is_given():
    h = idle_child()
    decision = send(T.root, found(T.child, *h.events))
    args = (T.child, h.state, 1, decision.events)
    kwargs = dict(policy=CFG, now=5.0, sources=[Source(T.root, sender_state(), 2, decision.sender_events)])

    assert plan_commit(*args, **kwargs) == plan_commit(*args, **kwargs)
