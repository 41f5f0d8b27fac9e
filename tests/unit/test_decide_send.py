"""decide_send: every refusal code, the guards at their boundaries, idempotency, approvals. Pure."""

from dataclasses import replace

import pytest

from treemail.domain.errors import Code
from treemail.domain import events as ev
from treemail.domain import state as st
from treemail.domain.commands import SendArguments
from treemail.domain.commands import InjectMail
from treemail.domain.decide import idempotency
from treemail.domain.decide.guards import Found, NoSuchHandle, NoSuchSession
from treemail.domain.decide.lifecycle import Given, decide_inject
from treemail.domain.decide.send import Accepted, AwaitsApproval, Refused, outcome_of
from treemail.domain.records import Peer

from .builders import (
    NOBODY_ID,
    approval_events,
    context,
    accepted,
    admitted,
    claimed,
    config,
    consumed,
    discarded,
    found,
    registered,
    released,
    run_finished,
    run_started,
    send,
    status_changed,
    tree,
)


def refused_code(decision) -> Code:
    assert isinstance(decision, Refused), decision
    return decision.code


# ---- happy path ------------------------------------------------------------------------------


def test_an_allowed_send_to_a_child_is_accepted_with_its_events_and_result():
    t = tree()
    decision = send(t.root, found(t.child), body="look at src/", mode="queue", message_id="m-42")

    assert isinstance(decision, Accepted)
    registered_producer, message = decision.events
    assert registered_producer == ev.ProducerRegistered(
        at=1.0, producer_id=f"agent:{t.root.session_id}", owner="agent", sender_session_id=t.root.session_id
    )
    assert isinstance(message, ev.ProducerMessageAccepted)
    assert message.message_id == "m-42"
    assert message.sender_session_id == t.root.session_id
    assert message.sender_handle == t.root.handle
    assert (message.body, message.mode, message.agent_hop) == ("look at src/", "queue", 0)
    assert (message.run_id, message.tool_call_id) == ("run-1", "call-1")
    assert decision.result == {"message_id": "m-42", "mode": "queue", "recipient_state": "running"}
    assert outcome_of(decision) == {"ok": decision.result}


def test_the_result_is_exactly_three_keys_unless_the_sender_reads_receipts_or_its_host_asked_for_the_number():
    """Success returns message_id, effective mode, and recipient_state: a default send's result has exactly
    those keys; the number in its pair only for a sender with the read receipt tool, or a host that asked."""
    t = tree()
    plain = send(t.root, found(t.child), message_id="m-1")
    assert set(plain.result) == {"message_id", "mode", "recipient_state"}
    with_receipts = send(t.root, found(t.child), message_id="m-2",
                         sender_events=(registered(t.root), ev.ToolsInstalled(at=0.0, tools=["read_receipt"]),
                                        run_started("run-1")))
    assert with_receipts.result == {"message_id": "m-2", "mode": "steer", "recipient_state": "running", "sequence": 1}
    asked = send(t.root, found(t.child), message_id="m-3", numbered=True)
    assert asked.result["sequence"] == 1 and len(asked.result) == 4


# ---- disabled --------------------------------------------------------------------------------


def test_disabled_refuses_even_when_rules_allow():
    t = tree(rules=[("*", "allow")])
    decision = send(t.root, found(t.child), cfg=config(enabled=False))
    assert refused_code(decision) is Code.DISABLED
    assert outcome_of(decision)["error"]["code"] == "send_message:disabled"


# ---- body ------------------------------------------------------------------------------------


def test_empty_body_is_invalid():
    t = tree()
    assert refused_code(send(t.root, found(t.child), body="")) is Code.INVALID_BODY


@pytest.mark.parametrize(
    "body, limit, ok",
    [
        ("a" * 10, 10, True),
        ("a" * 11, 10, False),
        ("é" * 5, 10, True),  # 5 characters, 10 UTF-8 bytes
        ("é" * 5 + "a", 10, False),  # 6 characters, 11 bytes
        ("é" * 6, 11, False),  # 12 bytes though only 6 characters
        ("🙂", 4, True),
        ("🙂", 3, False),
    ],
)
def test_body_limit_counts_utf8_bytes_and_is_inclusive(body, limit, ok):
    t = tree()
    decision = send(t.root, found(t.child), body=body, cfg=config(max_body_bytes=limit))
    if ok:
        assert isinstance(decision, Accepted)
    else:
        assert refused_code(decision) is Code.INVALID_BODY
        assert f"{len(body.encode())} bytes" in decision.message


@pytest.mark.parametrize("body", ["", "a", "é", "x" * 1000])
def test_max_body_bytes_zero_rejects_every_send(body):
    t = tree()
    assert refused_code(send(t.root, found(t.child), body=body, cfg=config(max_body_bytes=0))) is Code.INVALID_BODY


# ---- addressing ------------------------------------------------------------------------------


def test_a_uuid_naming_no_session_is_unknown_session():
    t = tree()
    decision = send(t.root, NoSuchSession(NOBODY_ID), to=NOBODY_ID)
    assert refused_code(decision) is Code.UNKNOWN_SESSION
    assert NOBODY_ID in decision.message


def test_a_found_record_whose_stream_is_not_registered_is_unknown_session():
    t = tree()
    decision = send(t.root, Found(t.child, st.INITIAL))
    assert refused_code(decision) is Code.UNKNOWN_SESSION


def test_an_unregistered_sender_is_unknown_session():
    t = tree()
    assert refused_code(send(None, found(t.child))) is Code.UNKNOWN_SESSION
    assert refused_code(send(t.root, found(t.child), sender_events=())) is Code.UNKNOWN_SESSION


def test_an_unknown_handle_lists_the_addressable_peers_for_self_repair():
    t = tree()
    peers = [Peer(t.child, "running"), Peer(t.sibling, "idle")]
    decision = send(t.root, NoSuchHandle("explore_deadbeef", peers), to="explore_deadbeef")

    assert refused_code(decision) is Code.UNKNOWN_SESSION
    assert "unknown subagent reference `explore_deadbeef`" in decision.message
    for peer in peers:
        line = (
            f"{peer.record.handle} — {peer.record.description} — {peer.status} "
            f"(session_id {peer.record.session_id})"
        )
        assert f"- {line}" in decision.message.splitlines()


def test_an_unknown_handle_with_no_peers_says_so():
    t = tree()
    decision = send(t.root, NoSuchHandle("nobody_00000000", []), to="nobody_00000000")
    assert refused_code(decision) is Code.UNKNOWN_SESSION
    assert decision.message.endswith("tree:\n- (none)")


def test_a_session_of_another_tree_is_not_a_tree_peer():
    t = tree()
    assert refused_code(send(t.root, found(t.stranger))) is Code.NOT_TREE_PEER


def test_sending_to_yourself_is_refused():
    t = tree()
    assert refused_code(send(t.child, found(t.child))) is Code.SELF_SEND


# ---- inbox cap -------------------------------------------------------------------------------


def test_inbox_full_at_the_pending_cap():
    t = tree()
    senders = [t.root, t.sibling, t.grandchild]
    history = [accepted(f"m-{i}", senders[i % 3]) for i in range(3)]
    cfg = config(max_pending_per_session=3, max_inflight_per_pair=0)

    decision = send(t.root, found(t.child, registered(t.child), *history), cfg=cfg)

    assert refused_code(decision) is Code.INBOX_FULL
    assert decision.recorded is True


def test_inbox_cap_admits_up_to_the_cap():
    t = tree()
    history = [accepted(f"m-{i}", t.sibling) for i in range(2)]
    cfg = config(max_pending_per_session=3, max_inflight_per_pair=0)
    assert isinstance(send(t.root, found(t.child, registered(t.child), *history), cfg=cfg), Accepted)


def test_injected_plugin_delegation_and_goal_mail_does_not_count_toward_the_inbox_cap():
    t = tree()
    cfg = config(max_pending_per_session=1)
    recipient = [registered(t.child)]
    for i, owner in enumerate(["plugin", "delegation", "goal", "plugin"]):
        given = Given(st.fold(recipient), {}, cfg)
        recipient += decide_inject(InjectMail(t.child.session_id, f"inj-{i}", owner, f"note {i}", "queue"), given)

    assert st.fold(recipient).pending_agent == 0
    assert isinstance(send(t.root, found(t.child, *recipient), cfg=cfg), Accepted)


@pytest.mark.parametrize("done", [consumed, discarded])
def test_consumed_or_discarded_mail_frees_an_inbox_slot(done):
    t = tree()
    cfg = config(max_pending_per_session=1, max_inflight_per_pair=0)
    full = [registered(t.child), accepted("m-0", t.sibling), claimed("m-0", t.sibling)]
    assert refused_code(send(t.root, found(t.child, *full), cfg=cfg)) is Code.INBOX_FULL

    freed = [*full, done("m-0", t.sibling)]
    assert isinstance(send(t.root, found(t.child, *freed), cfg=cfg), Accepted)


def test_released_mail_still_holds_its_inbox_slot():
    t = tree()
    cfg = config(max_pending_per_session=1, max_inflight_per_pair=0)
    history = [registered(t.child), accepted("m-0", t.sibling), claimed("m-0", t.sibling), released("m-0", t.sibling)]
    assert refused_code(send(t.root, found(t.child, *history), cfg=cfg)) is Code.INBOX_FULL


# ---- pair window -----------------------------------------------------------------------------


def test_a_window_of_four_admits_four_and_refuses_the_fifth():
    t = tree()
    cfg = config(max_inflight_per_pair=4)
    recipient = [registered(t.child)]
    for i in range(4):
        decision = send(t.root, found(t.child, *recipient), cfg=cfg, message_id=f"m-{i}", tool_call_id=f"c-{i}")
        assert isinstance(decision, Accepted), (i, decision)
        recipient += decision.events

    fifth = send(t.root, found(t.child, *recipient), cfg=cfg, message_id="m-4", tool_call_id="c-4")
    assert refused_code(fifth) is Code.INFLIGHT_FULL
    assert fifth.recorded is True


def test_the_window_is_per_directed_pair():
    t = tree()
    cfg = config(max_inflight_per_pair=1)
    recipient = [registered(t.child), accepted("m-0", t.root)]
    assert refused_code(send(t.root, found(t.child, *recipient), cfg=cfg)) is Code.INFLIGHT_FULL
    assert isinstance(send(t.grandchild, found(t.child, *recipient), cfg=cfg), Accepted)


def test_a_window_of_zero_disables_the_pair_guard():
    t = tree()
    cfg = config(max_inflight_per_pair=0, max_pending_per_session=100)
    recipient = [registered(t.child), *(accepted(f"m-{i}", t.root) for i in range(50))]
    assert isinstance(send(t.root, found(t.child, *recipient), cfg=cfg), Accepted)


@pytest.mark.parametrize("done", [consumed, discarded])
def test_consumed_or_discarded_mail_frees_a_pair_window_slot(done):
    t = tree()
    cfg = config(max_inflight_per_pair=1)
    full = [registered(t.child), accepted("m-0", t.root), claimed("m-0", t.root)]
    assert refused_code(send(t.root, found(t.child, *full), cfg=cfg)) is Code.INFLIGHT_FULL
    assert isinstance(send(t.root, found(t.child, *full, done("m-0", t.root)), cfg=cfg), Accepted)


def test_released_mail_still_holds_its_pair_window_slot():
    t = tree()
    cfg = config(max_inflight_per_pair=1)
    history = [registered(t.child), accepted("m-0", t.root), claimed("m-0", t.root), released("m-0", t.root)]
    assert refused_code(send(t.root, found(t.child, *history), cfg=cfg)) is Code.INFLIGHT_FULL


# ---- hops ------------------------------------------------------------------------------------


def sender_with(record, *events):
    return (registered(record), run_started("run-1"), *events)


@pytest.mark.parametrize(
    "observed, max_hops, ok",
    [
        ((), 1, True),  # hop 0
        ((admitted("x", hop=2),), 3, True),  # hop 3 == max
        ((admitted("x", hop=3),), 3, False),  # hop 4 > max
        ((claimed("x", hop=3),), 3, False),
        ((consumed("x", hop=3),), 3, False),
        ((admitted("x", hop=50),), 0, True),  # disabled
        ((admitted("x", hop=50),), -1, True),  # disabled
    ],
)
def test_hop_limit_is_inclusive_and_non_positive_disables_it(observed, max_hops, ok):
    t = tree()
    observed = tuple(e.model_copy(update={"sender_session_id": t.sibling.session_id}) for e in observed)
    decision = send(t.child, found(t.root), sender_events=sender_with(t.child, *observed), cfg=config(max_hops=max_hops))
    if ok:
        assert isinstance(decision, Accepted), decision
    else:
        assert refused_code(decision) is Code.MAX_HOPS_EXCEEDED
        assert decision.recorded is True


def hop_of(t, *sender_events, run_id="run-1"):
    decision = send(t.child, found(t.root), sender_events=sender_with(t.child, *sender_events), run_id=run_id)
    assert isinstance(decision, Accepted), decision
    return decision.events[-1].agent_hop


def test_a_run_that_observed_no_agent_mail_sends_hop_zero():
    assert hop_of(tree()) == 0


def test_hop_is_one_more_than_the_highest_hop_the_run_observed():
    t = tree()
    s = t.sibling
    assert hop_of(t, admitted("a", s, hop=1), claimed("b", s, hop=4), consumed("c", s, hop=2)) == 5


def test_releasing_observed_mail_does_not_lower_the_hop():
    t = tree()
    s = t.sibling
    assert hop_of(t, accepted("a", s, hop=3), claimed("a", s, hop=3), released("a", s, hop=3)) == 4


def test_discarded_mail_never_raises_the_hop():
    t = tree()
    s = t.sibling
    assert hop_of(t, accepted("a", s, hop=7), discarded("a", s, hop=7)) == 0


@pytest.mark.parametrize("owner", ["plugin", "delegation", "goal"])
def test_non_agent_mail_never_raises_the_hop(owner):
    t = tree()
    assert hop_of(t, admitted("a", owner=owner, hop=9), claimed("a", owner=owner, hop=9)) == 0


def test_hops_observed_by_another_run_do_not_count():
    t = tree()
    s = t.sibling
    events = (admitted("a", s, "run-0", hop=5), claimed("a", s, "run-0", hop=5))
    assert hop_of(t, *events, run_id="run-1") == 0


def test_a_finished_run_forgets_its_hops():
    t = tree()
    s = t.sibling
    # The same run id opened again (a new incarnation) starts with no hops observed.
    assert hop_of(t, claimed("a", s, hop=5), run_finished("run-1"), run_started("run-1")) == 0


# ---- permissions -----------------------------------------------------------------------------


def test_a_deny_rule_refuses_with_permission_denied():
    t = tree().with_rules("child", [("parent", "deny"), ("*", "allow")])
    decision = send(t.child, found(t.root))
    assert refused_code(decision) is Code.PERMISSION_DENIED
    assert "parent" in decision.message


def test_no_matching_rule_is_deny():
    t = tree().with_rules("child", [("sibling", "allow")])
    assert refused_code(send(t.child, found(t.root))) is Code.PERMISSION_DENIED


def test_a_sender_without_the_tool_is_denied():
    t = tree()
    assert refused_code(send(replace(t.root, send_message_tool=False), found(t.child))) is Code.PERMISSION_DENIED
    assert refused_code(send(replace(t.root, rules=[("*", "deny")]), found(t.child))) is Code.PERMISSION_DENIED


def test_ask_opens_one_approval_request_on_the_sender_and_nothing_on_the_recipient():
    t = tree().with_rules("child", [("sibling", "ask")])
    decision = send(t.child, found(t.sibling), message_id="req-9")
    assert isinstance(decision, AwaitsApproval)
    assert (decision.request_id, decision.label) == ("req-9", "sibling")
    [request] = decision.events
    assert isinstance(request, ev.ApprovalRequested)
    assert (request.sender_session_id, request.recipient_session_id) == (t.child.session_id, t.sibling.session_id)
    assert request.key == idempotency.key_digest(context(t.child))


def test_ask_with_a_pending_approval_waits_on_the_same_request_and_opens_no_other():
    t = tree().with_rules("child", [("sibling", "ask")])
    decision = send(t.child, found(t.sibling), approval="pending")
    assert isinstance(decision, AwaitsApproval)
    assert decision.events == [] and decision.request_id == "req-1"


@pytest.mark.parametrize("change", [{"body": "other"}, {"mode": "queue"}])
def test_an_approval_covers_only_what_the_person_saw(change):
    t = tree().with_rules("child", [("sibling", "ask"), ("parent", "allow")])
    approved = [registered(t.child), run_started("run-1"), *approval_events(
        t.child, t.sibling.session_id, "approved", to="explore_00000002", body="hello", mode="steer",
        run_id="run-1", tool_call_id="call-1")]
    decision = send(t.child, found(t.sibling), sender_events=tuple(approved), **change)
    assert refused_code(decision) is Code.IDEMPOTENCY_CONFLICT


def test_an_approval_for_one_recipient_does_not_cover_another():
    t = tree().with_rules("child", [("sibling", "ask"), ("parent", "ask")])
    approved = [registered(t.child), run_started("run-1"), *approval_events(
        t.child, t.sibling.session_id, "approved", to="explore_00000002", body="hello", mode="steer",
        run_id="run-1", tool_call_id="call-1")]
    decision = send(t.child, found(t.root), sender_events=tuple(approved))
    assert refused_code(decision) is Code.IDEMPOTENCY_CONFLICT


def test_ask_approved_once_is_accepted():
    t = tree().with_rules("child", [("sibling", "ask")])
    assert isinstance(send(t.child, found(t.sibling), approval="approved"), Accepted)


def test_ask_denied_is_permission_denied():
    t = tree().with_rules("child", [("sibling", "ask")])
    assert refused_code(send(t.child, found(t.sibling), approval="denied")) is Code.PERMISSION_DENIED


def test_ask_with_a_tree_grant_is_accepted():
    t = tree().with_rules("child", [("sibling", "ask")])
    assert isinstance(send(t.child, found(t.sibling), tree_granted=True), Accepted)


def test_a_tree_grant_does_not_override_deny():
    t = tree().with_rules("child", [("sibling", "deny"), ("parent", "allow")])
    decision = send(t.child, found(t.sibling), approval="approved", tree_granted=True)
    assert refused_code(decision) is Code.PERMISSION_DENIED


def test_guards_are_checked_after_approval():
    t = tree().with_rules("child", [("sibling", "ask")])
    full = [registered(t.sibling), accepted("m-0", t.child)]
    decision = send(t.child, found(t.sibling, *full), cfg=config(max_inflight_per_pair=1), approval="approved")
    assert refused_code(decision) is Code.INFLIGHT_FULL


# ---- idempotency -----------------------------------------------------------------------------


def test_a_retried_tool_call_is_answered_with_the_recorded_outcome():
    t = tree()
    first = send(t.root, found(t.child), body="hi", message_id="m-1")
    recorded = idempotency.record(SendArguments(to="explore_00000002", body="hi"), outcome_of(first))

    again = idempotency.replayed_outcome(recorded, SendArguments(to="explore_00000002", body="hi"))

    assert again == outcome_of(first)
    assert again["ok"]["message_id"] == "m-1"


@pytest.mark.parametrize("code", sorted(idempotency.WITH_RECIPIENT))
def test_refusals_that_depend_on_the_recipient_are_recorded_with_its_append_and_others_alone(code):
    assert Refused(code, "").recorded and not Refused(code, "").recorded_alone
    for other in (Code.DISABLED, Code.INVALID_BODY, Code.PERMISSION_DENIED, Code.UNKNOWN_SESSION):
        assert Refused(other, "").recorded_alone and not Refused(other, "").recorded
    assert not Refused(Code.IDEMPOTENCY_CONFLICT, "").recorded_alone


@pytest.mark.parametrize("change", [{"body": "other"}, {"mode": "queue"}, {"to": "review_00000003"}])
def test_the_same_tool_call_with_different_arguments_is_an_idempotency_conflict(change):
    recorded = idempotency.record(SendArguments(to="explore_00000002", body="hello"), {"ok": {}})
    arguments = SendArguments(**{"to": "explore_00000002", "body": "hello", **change})
    again = idempotency.replayed_outcome(recorded, arguments)
    assert again["error"]["code"] == Code.IDEMPOTENCY_CONFLICT.value


# ---- producers and recipient state -----------------------------------------------------------


def test_producer_registered_only_on_the_first_send_of_a_pair():
    t = tree()
    recipient = [registered(t.child)]
    first = send(t.root, found(t.child, *recipient), message_id="m-1")
    recipient += first.events
    second = send(t.root, found(t.child, *recipient), message_id="m-2", tool_call_id="call-2")
    other_sender = send(t.grandchild, found(t.child, *recipient), message_id="m-3")

    assert [type(e) for e in first.events] == [ev.ProducerRegistered, ev.ProducerMessageAccepted]
    assert [type(e) for e in second.events] == [ev.ProducerMessageAccepted]
    assert [type(e) for e in other_sender.events] == [ev.ProducerRegistered, ev.ProducerMessageAccepted]


@pytest.mark.parametrize(
    "status, label",
    [("running", "running"), ("queued", "queued"), ("idle", "queued"), ("finished", "waking_finished")],
)
def test_recipient_state_label(status, label):
    t = tree()
    decision = send(t.root, found(t.child, registered(t.child, status=status)))
    assert decision.result["recipient_state"] == label


def test_recipient_state_follows_status_changes_in_the_stream():
    t = tree()
    history = [registered(t.child, status="queued"), run_started("r"), status_changed("finished")]
    assert send(t.root, found(t.child, *history)).result["recipient_state"] == "waking_finished"
    history = [registered(t.child, status="idle"), run_started("r")]
    assert send(t.root, found(t.child, *history)).result["recipient_state"] == "running"


def test_a_refusal_renders_its_stable_code_and_message():
    t = tree()
    decision = send(t.child, found(t.child))
    assert outcome_of(decision) == {"error": {"code": "send_message:self_send", "message": decision.message}}


def test_the_permission_message_names_a_non_family_peer_as_tree_peer():
    t = tree().with_rules("grandchild", [("parent", "allow")])
    assert "tree peer" in send(t.grandchild, found(t.root)).message
