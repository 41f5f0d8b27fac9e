"""Expiry, supersede and cancel: given/when/then on the pure deciders and the claim-time filter."""

from dataclasses import replace

import pytest

from treemail.domain import events as ev
from treemail.domain import state as st
from treemail.domain.commands import CancelMail, ClaimMail, KeepObligations, SendArguments, SendContext, SendMessage
from treemail.domain.decide import idempotency, mailcontrol
from treemail.domain.decide.guards import Found
from treemail.domain.decide.lifecycle import decide_claim
from treemail.domain.decide.obligations import decide_keep
from treemail.domain.decide.send import Accepted, SendGiven, decide_send
from treemail.domain.errors import Rejected
from treemail.domain.outbound import source_events

from .builders import History, claimed, config, consumed, given_lifecycle, registered, run_started, tree


def _send(history: History, sender, recipient, body: str, message_id: str, *, now: float = 1.0,
          expires_in_s: float | None = None, supersede_key: str | None = None) -> Accepted:
    arguments = SendArguments(to=recipient.handle, body=body, expires_in_s=expires_in_s, supersede_key=supersede_key)
    command = SendMessage("cmd", SendContext(sender.session_id, "run-s", f"call-{message_id}"), arguments, "client")
    sender_state = st.fold([registered(sender), run_started("run-s")])
    decision = decide_send(command, SendGiven(sender=sender, sender_state=sender_state,
                                              target=Found(recipient, history.state), config=config(),
                                              new_id=message_id, now=now))
    assert isinstance(decision, Accepted), decision
    history.then(decision.events)
    return decision


def _recipient():
    t = tree()
    return t, History(registered(t.child), run_started("run-c"))


# ---- expiry ----------------------------------------------------------------------------------------


def test_an_expired_message_is_skipped_by_a_claim_and_settled_as_expired_by_the_pump():
    t, child = _recipient()
    _send(child, t.root, t.child, "stop the build", "m-old", now=10.0, expires_in_s=5.0)
    _send(child, t.root, t.child, "keep going", "m-new", now=11.0)
    item = child.mail["m-old"]
    assert item.expires_at == 15.0
    assert mailcontrol.claimable_now(item, 14.9) and not mailcontrol.claimable_now(item, 15.0)
    claimed_now = decide_claim(ClaimMail(t.child.session_id, "run-c"), given_lifecycle(child, now=16.0))
    assert [e.message_id for e in claimed_now] == ["m-new"]  # the expired one never reaches a model
    kept = decide_keep(KeepObligations(t.child.session_id), given_lifecycle(child, now=16.0))
    expired = [e for e in kept if isinstance(e, ev.ProducerMessageDiscarded)]
    assert [(e.message_id, e.reason) for e in expired] == [("m-old", "expired")]
    # Its sender reads the settlement: discarded, reason expired.
    (record,) = source_events(t.child.session_id, "running", expired, 10)[t.root.session_id]
    assert (record.outcome, record.reason) == ("discarded", "expired")


def test_the_pump_looks_at_a_session_when_its_mail_expires_and_not_before():
    t, child = _recipient()
    _send(child, t.root, t.child, "stop", "m-1", now=10.0, expires_in_s=5.0)
    assert decide_keep(KeepObligations(t.child.session_id), given_lifecycle(child, now=14.0)) == []
    from treemail.domain.decide.delivery import next_check
    assert next_check(child.state, child.mail.values(), config(), 11.0) == 15.0


def test_a_claimed_message_that_expires_was_delivered_and_is_left_to_its_attempt():
    t, child = _recipient()
    _send(child, t.root, t.child, "stop", "m-1", now=10.0, expires_in_s=5.0)
    child.then([claimed("m-1", t.root, run_id="run-c")])
    kept = decide_keep(KeepObligations(t.child.session_id), given_lifecycle(child, now=16.0))
    assert not [e for e in kept if isinstance(e, ev.ProducerMessageDiscarded)]


@pytest.mark.parametrize("expires_in_s, key", [(0, None), (-1, None), (float("nan"), None), (True, None),
                                               (None, ""), (None, "two\nlines"), (None, "k" * 201)])
def test_bad_send_options_are_refused_before_anything_is_stored(expires_in_s, key):
    with pytest.raises(Rejected) as refused:
        mailcontrol.with_send_options(SendArguments(to="x", body="y"), expires_in_s, key)
    assert refused.value.code.value == "send_message:invalid_arguments"


def test_the_send_options_change_the_tool_calls_fingerprint_only_when_given():
    plain = SendArguments(to="x", body="y")
    assert idempotency.fingerprint(plain) == idempotency.fingerprint(replace(plain))
    assert idempotency.fingerprint(plain) != idempotency.fingerprint(replace(plain, supersede_key="k"))


# ---- supersede -------------------------------------------------------------------------------------


def test_a_newer_message_with_the_same_key_replaces_the_unclaimed_older_one():
    t, child = _recipient()
    _send(child, t.root, t.child, "status: 10%", "m-1", supersede_key="progress")
    decision = _send(child, t.root, t.child, "status: 20%", "m-2", supersede_key="progress")
    gone = [e for e in decision.events if isinstance(e, ev.ProducerMessageDiscarded)]
    assert [(e.message_id, e.reason) for e in gone] == [("m-1", "superseded")]
    assert [e.superseded_by for e in gone] == ["m-2"]  # the record names the message that took its place
    assert set(child.mail) == {"m-2"} and child.state.pending_agent == 1
    assert [e.outcome for e in decision.sender_events if isinstance(e, ev.MessageSettled)] == ["discarded"]
    # Latest wins again; another key, or none, replaces nothing.
    _send(child, t.root, t.child, "status: 30%", "m-3", supersede_key="progress")
    _send(child, t.root, t.child, "other", "m-4", supersede_key="other")
    _send(child, t.root, t.child, "plain", "m-5")
    assert set(child.mail) == {"m-3", "m-4", "m-5"}


def test_a_claimed_or_consumed_older_message_is_not_superseded():
    t, child = _recipient()
    _send(child, t.root, t.child, "status: 10%", "m-1", supersede_key="progress")
    child.then([claimed("m-1", t.root, run_id="run-c")])
    decision = _send(child, t.root, t.child, "status: 20%", "m-2", supersede_key="progress")
    assert not [e for e in decision.events if isinstance(e, ev.ProducerMessageDiscarded)]
    child.then([consumed("m-1", t.root, run_id="run-c")])
    _send(child, t.root, t.child, "status: 30%", "m-3", supersede_key="progress")
    assert set(child.mail) == {"m-3"}  # m-2 was unclaimed: replaced


def test_a_key_is_the_senders_own():
    t, child = _recipient()
    _send(child, t.root, t.child, "from root", "m-1", supersede_key="k")
    _send(child, t.sibling, t.child, "from sibling", "m-2", supersede_key="k")
    assert set(child.mail) == {"m-1", "m-2"}


# ---- cancel ----------------------------------------------------------------------------------------


def test_cancel_before_a_claim_cancels_and_after_one_answers_already_delivered():
    t, child = _recipient()
    _send(child, t.root, t.child, "a", "m-1")
    _send(child, t.root, t.child, "b", "m-2")
    events = mailcontrol.decide_cancel(CancelMail(t.child.session_id, "m-1", "sender"), given_lifecycle(child))
    assert [type(e).__name__ for e in events] == ["ProducerMessageDiscarded", "MessageCancelAnswered"]
    assert events[0].reason == "cancelled" and events[1].outcome == "cancelled" and events[1].by == "sender"
    child.then(events)
    claimed_now = decide_claim(ClaimMail(t.child.session_id, "run-c"), given_lifecycle(child, now=2.0))
    assert [e.message_id for e in claimed_now] == ["m-2"]
    child.then(claimed_now)
    late = mailcontrol.decide_cancel(CancelMail(t.child.session_id, "m-2"), given_lifecycle(child))
    assert [(type(e).__name__, e.outcome) for e in late] == [("MessageCancelAnswered", "already_delivered")]
    child.then(late)
    assert set(child.mail) == {"m-2"} and child.mail["m-2"].state == "claimed"


def test_peer_mail_in_its_sources_outbox_is_cancelled_there_unless_an_attempt_is_in_flight():
    from treemail.domain.commands import CancelPeerDelivery
    from treemail.domain.errors import LifecycleError

    t = tree()
    intent = ev.PeerIntentStored(at=1.0, message_id="p-1", destination_session_id=t.sibling.session_id,
                                 peer="review", principal="svc", body="look", mode="steer")
    source = History(registered(t.child), run_started("run-c"), intent)
    started = ev.PeerAttemptStarted(at=2.0, message_id="p-1", attempt=1)
    with pytest.raises(LifecycleError) as in_flight:
        mailcontrol.decide_cancel_peer(CancelPeerDelivery(t.child.session_id, "p-1"),
                                       given_lifecycle(History(*source.events, started)))
    assert in_flight.value.code == "cancel_message:in_flight"
    events = mailcontrol.decide_cancel_peer(CancelPeerDelivery(t.child.session_id, "p-1"), given_lifecycle(source))
    assert [(type(e).__name__, getattr(e, "reason", None) or getattr(e, "outcome", None)) for e in events] == [
        ("MessageSettled", "cancelled"), ("MessageCancelAnswered", "cancelled")]
    source.then(events)
    assert source.state.outbox == {} and source.state.outstanding == 0  # no attempt can start any more


# ---- the tool arguments, where the host enables them ------------------------------------------------


def test_send_message_takes_expiry_and_a_key_only_where_the_host_enabled_them():
    from treemail.producers.tools import send_message as tool

    plain = tool.tool_definition([("*", "allow")])
    enabled = tool.tool_definition([("*", "allow")], mail_control=True)
    assert set(plain["input_schema"]["properties"]) == {"to", "body", "mode"}
    assert set(enabled["input_schema"]["properties"]) == {"to", "body", "mode", "expires_in_s", "supersede_key"}
    asked = {"to": "explore_1", "body": "STOP", "expires_in_s": 30, "supersede_key": "deploy"}
    with pytest.raises(Rejected) as unknown:
        tool.parse_arguments(asked)
    assert unknown.value.code.value == "send_message:invalid_arguments"
    parsed = tool.parse_arguments(asked, mail_control=True)
    assert (parsed.expires_in_s, parsed.supersede_key) == (30.0, "deploy")
    with pytest.raises(Rejected):
        tool.parse_arguments({**asked, "expires_in_s": "soon"}, mail_control=True)
    assert tool.parse_arguments({"to": "explore_1", "body": "hi"}, mail_control=True).expires_in_s is None


def test_a_cancel_of_a_message_settled_before_it_is_answered_as_settled_and_recorded():
    t, child = _recipient()
    _send(child, t.root, t.child, "a", "m-1")
    child.then([claimed("m-1", t.root, run_id="run-c"), consumed("m-1", t.root, run_id="run-c")])
    # Consumed: no longer in the recipient's mail; the sender's record says how it ended.
    done = mailcontrol.decide_cancel(CancelMail(t.child.session_id, "m-1", "host", "consumed"), given_lifecycle(child))
    assert [(type(e).__name__, e.outcome, e.settled) for e in done] == [
        ("MessageCancelAnswered", "already_delivered", "consumed")]
    gone = mailcontrol.decide_cancel(CancelMail(t.child.session_id, "m-0", "sender", "expired"), given_lifecycle(child))
    assert [(type(e).__name__, e.outcome, e.settled, e.by) for e in gone] == [
        ("MessageCancelAnswered", "cancelled", "expired", "sender")]


def test_a_cancel_of_peer_mail_discarded_in_its_outbox_is_recorded_on_its_source():
    from treemail.domain.commands import CancelPeerDelivery

    t = tree()
    source = History(registered(t.child), run_started("run-c"))
    events = mailcontrol.decide_cancel_peer(CancelPeerDelivery(t.child.session_id, "p-1", "host", "discarded"),
                                            given_lifecycle(source))
    assert [(type(e).__name__, e.outcome, e.settled) for e in events] == [
        ("MessageCancelAnswered", "cancelled", "discarded")]
