"""Peer routes, grants, replies and input schemas, given/when/then on the pure decisions."""

import json

import pytest

from treemail.domain import events as ev
from treemail.domain import grants, outbox, peers
from treemail.domain import state as st
from treemail.domain.commands import (
    PeerSendArguments,
    RecordPeerAdmission,
    RegisterPeerRoute,
    RevokePeerRoute,
    SendContext,
    SendToPeer,
    SetPeerGrant,
)
from treemail.domain.decide import peerdelivery, routes
from treemail.domain.decide.guards import Found
from treemail.domain.decide.send import Accepted, Refused, SendGiven
from treemail.domain.errors import Code
from treemail.domain.handlers import HANDLERS

from .builders import (History, accepted, claimed, config, consumed, discarded, given_lifecycle, registered, run_started,
                       session_record)

PLANNER = session_record("0190a000-0000-7000-8000-0000000000a1", agent_type="planner", rules=[])
ADVISOR = session_record("0190a000-0000-7000-8000-0000000000b1", agent_type="advisor", rules=[])
OTHER_PLANNER = session_record("0190a000-0000-7000-8000-0000000000a2", agent_type="planner", rules=[])
QUESTION = {"type": "object", "properties": {"question": {"type": "string"}}, "required": ["question"]}


def route(source=PLANNER, name="advisor", kind="session", schema=None) -> ev.PeerRouteRegistered:
    who = source.session_id if kind == "session" else source.agent_type
    return ev.PeerRouteRegistered(source_kind=kind, source=who, name=name, input_schema=schema)


def grant(source=PLANNER, kind="session", principal="acme", **operations) -> ev.PeerGrantSet:
    who = source.session_id if kind == "session" else source.agent_type
    return ev.PeerGrantSet(source_kind=kind, source=who, principal=principal, **operations)


def peer_accepted(message_id: str, sender, principal="acme", body="hello") -> ev.ProducerMessageAccepted:
    return accepted(message_id, sender, body=body).model_copy(update={"principal": principal, "peer": "x"})


def target(record, *events) -> Found:
    return Found(record, st.fold([registered(record), *events]))


def decide(sender, found, *, peer="advisor", body="hello", reply=False, in_reply_to=None, sender_events=(),
           cfg=None, tool_call_id="call-1"):
    command = SendToPeer(SendContext(sender.session_id, "run-1", tool_call_id),
                         PeerSendArguments(peer, body, "steer", in_reply_to, reply))
    # Sent from its open run (only the exact live sender may send).
    given = SendGiven(sender=sender, sender_state=st.fold([registered(sender), run_started("run-1"), *sender_events]),
                      target=found,
                      config=cfg or config(), new_id="m-1", now=5.0)
    return HANDLERS[SendToPeer].decide(command, given)


def code_of(decision) -> Code:
    assert isinstance(decision, Refused), decision
    return decision.code


# ---- routes ------------------------------------------------------------------------------------------------


def admit(sender, found, intent, cfg=None):
    """The admission attempt of a stored intent, on the destination as ``found`` holds it."""
    return peerdelivery.decide_admission(peerdelivery.AdmissionGiven(
        intent=intent, sender=sender, sender_state=st.fold([registered(sender)]), target=found,
        config=cfg or config(), now=6.0, target_version=4,
    ))


def test_a_send_over_a_granted_route_is_stored_on_the_source_as_a_pending_intent_with_its_principal():
    found = target(ADVISOR, route(), grant(send=True, principal="acme/planning"))
    decision = decide(PLANNER, found)
    assert isinstance(decision, Accepted)
    [intent] = decision.events
    assert isinstance(intent, ev.PeerIntentStored)
    assert (intent.message_id, intent.destination_session_id, intent.principal, intent.peer) == (
        "m-1", ADVISOR.session_id, "acme/planning", "advisor")
    assert decision.result == {"message_id": "m-1", "peer": "advisor", "mode": "steer", "status": "pending"}


def test_its_admission_accepts_it_on_the_destination_under_the_same_identity_principal_and_return_address():
    found = target(ADVISOR, route(), grant(send=True, principal="acme/planning"))
    [intent] = decide(PLANNER, found).events
    admitted = admit(PLANNER, found, intent)
    assert isinstance(admitted, Accepted), admitted
    [registered_producer, message, *_] = admitted.events
    assert isinstance(registered_producer, ev.ProducerRegistered)
    assert (message.message_id, message.principal, message.peer, message.return_address,
            message.sender_session_id) == ("m-1", "acme/planning", "advisor", PLANNER.session_id, PLANNER.session_id)
    # The receipt names the accepted event's position on the destination's stream (after the producer's).
    assert admitted.result == {"message_id": "m-1", "position": 6, "recipient_state": "running", "sequence": 1}
    assert admitted.sources == []  # nothing of this step goes on the source's stream


def test_the_intent_keeps_the_hosts_code_version_and_every_attempt_carries_it_whatever_the_driver_runs():
    """Each stored intent keeps a host-supplied code version; automatic retries preserve the exact destination,
    input, principal, code version, and admission identity."""
    found = target(ADVISOR, route(), grant(send=True, principal="acme/planning"))
    [intent] = decide(PLANNER, found, cfg=config(peer_code_version="host-1.4.2")).events
    assert intent.code_version == "host-1.4.2"
    # a later attempt, made by a driver configured with another version, admits the intent as stored
    admitted = admit(PLANNER, found, intent, cfg=config(peer_code_version="driver-2.0.0"))
    [message] = [e for e in admitted.events if isinstance(e, ev.ProducerMessageAccepted)]
    assert (message.message_id, message.principal, message.body, message.code_version) == (
        "m-1", "acme/planning", "hello", "host-1.4.2")
    # the source's row keeps it for inspect at every stage, and its receipt carries it
    source = st.fold([registered(PLANNER), intent])
    assert source.outbox["m-1"].code_version == "host-1.4.2"
    assert outbox.status_of(source.outbox["m-1"], PLANNER.session_id, config(), 5.0)["code_version"] == "host-1.4.2"
    receipt = peerdelivery.decide_record_admission(
        RecordPeerAdmission(PLANNER.session_id, "m-1", 1, "accepted", position=6, recipient_state="running"),
        given_lifecycle(History(registered(PLANNER), intent)))
    assert receipt[0].code_version == "host-1.4.2"
    # none given: nothing stored, and a row reads back as before
    [plain] = decide(PLANNER, found).events
    assert plain.code_version is None and len(st.fold([registered(PLANNER), plain]).outbox["m-1"].to_list()) == 11
    assert outbox.Row.from_list(source.outbox["m-1"].to_list()) == source.outbox["m-1"]


def test_without_a_route_or_with_a_route_under_another_name_the_peer_is_unknown():
    assert code_of(decide(PLANNER, target(ADVISOR, grant(send=True)))) is Code.PEER_UNKNOWN
    assert code_of(decide(PLANNER, target(ADVISOR, route(name="critic"), grant(send=True)))) is Code.PEER_UNKNOWN
    nowhere = decide(PLANNER, routes.NoSuchPeer("advisor", ["critic"]))
    assert code_of(nowhere) is Code.PEER_UNKNOWN and "`critic`" in nowhere.message


def test_a_route_registered_for_another_session_does_not_carry_this_one():
    found = target(ADVISOR, route(source=OTHER_PLANNER), grant(source=OTHER_PLANNER, send=True))
    assert code_of(decide(PLANNER, found)) is Code.PEER_UNKNOWN
    assert isinstance(decide(OTHER_PLANNER, found), Accepted)


def test_a_route_by_agent_type_carries_every_session_of_that_type_and_a_revoked_route_nothing():
    by_type = target(ADVISOR, route(kind="agent_type"), grant(kind="agent_type", send=True))
    assert isinstance(decide(PLANNER, by_type), Accepted)
    assert isinstance(decide(OTHER_PLANNER, by_type), Accepted)
    revoked = ev.PeerRouteRevoked(source_kind="agent_type", source="planner", name="advisor")
    assert code_of(decide(PLANNER, target(ADVISOR, route(kind="agent_type"), revoked,
                                          grant(kind="agent_type", send=True)))) is Code.PEER_UNKNOWN


def test_a_route_to_the_sender_itself_is_a_self_send():
    assert code_of(decide(PLANNER, target(PLANNER, route(), grant(send=True)), peer="advisor")) is Code.SELF_SEND


def test_registering_the_same_route_or_grant_twice_appends_once_and_revoking_an_absent_route_nothing():
    h = History(registered(ADVISOR))
    register = RegisterPeerRoute(ADVISOR.session_id, "session", PLANNER.session_id, "advisor", "reviews",
                                 json.dumps(QUESTION))
    first = h.then(HANDLERS[RegisterPeerRoute].decide(register, given_lifecycle(h)))
    assert [type(e) for e in first] == [ev.PeerRouteRegistered] and first[0].input_schema == QUESTION
    assert HANDLERS[RegisterPeerRoute].decide(register, given_lifecycle(h)) == []
    set_grant = SetPeerGrant(ADVISOR.session_id, "session", PLANNER.session_id, "acme", send=True)
    assert len(h.then(HANDLERS[SetPeerGrant].decide(set_grant, given_lifecycle(h)))) == 1
    assert HANDLERS[SetPeerGrant].decide(set_grant, given_lifecycle(h)) == []
    revoke = RevokePeerRoute(ADVISOR.session_id, "session", PLANNER.session_id, "advisor")
    assert len(h.then(HANDLERS[RevokePeerRoute].decide(revoke, given_lifecycle(h)))) == 1
    assert HANDLERS[RevokePeerRoute].decide(revoke, given_lifecycle(h)) == []
    assert h.state.peers.routes == {} and "session:" + PLANNER.session_id in h.state.peers.grants


def test_a_peer_intent_passes_the_hop_guard_and_its_admission_the_destinations_inbox_and_window_guards():
    base = (route(), grant(send=True))
    [intent] = decide(PLANNER, target(ADVISOR, *base)).events
    full_inbox = [accepted(f"m{i}", OTHER_PLANNER) for i in range(2)]
    assert code_of(admit(PLANNER, target(ADVISOR, *base, *full_inbox), intent,
                         cfg=config(max_pending_per_session=2))) is Code.INBOX_FULL
    window = [accepted(f"m{i}", PLANNER) for i in range(2)]
    assert code_of(admit(PLANNER, target(ADVISOR, *base, *window), intent, cfg=config(max_inflight_per_pair=2))) \
        is Code.INFLIGHT_FULL
    relayed = (run_started("run-1"), accepted("in", OTHER_PLANNER, hop=2), claimed("in", OTHER_PLANNER, hop=2))
    refused = decide(PLANNER, target(ADVISOR, *base), sender_events=relayed, cfg=config(max_hops=2))
    assert code_of(refused) is Code.MAX_HOPS_EXCEEDED and refused.recorded
    assert code_of(decide(PLANNER, target(ADVISOR, *base), body="")) is Code.INVALID_BODY
    assert code_of(decide(PLANNER, target(ADVISOR, *base), cfg=config(enabled=False))) is Code.DISABLED


def test_an_admission_after_the_route_or_the_grant_was_taken_back_is_refused_for_good():
    [intent] = decide(PLANNER, target(ADVISOR, route(), grant(send=True))).events
    assert code_of(admit(PLANNER, target(ADVISOR, grant(send=True)), intent)) is Code.PEER_UNKNOWN
    assert code_of(admit(PLANNER, target(ADVISOR, route(), grant(send=False)), intent)) is Code.PEER_NOT_GRANTED


def test_an_admission_past_its_sources_own_cutoff_is_refused_for_good():
    found = target(ADVISOR, route(), grant(send=True))
    [intent] = decide(PLANNER, found).events
    closing = st.fold([registered(PLANNER), ev.SessionClosing(stop_reason="aborted")])
    refused = peerdelivery.decide_admission(peerdelivery.AdmissionGiven(
        intent=intent, sender=PLANNER, sender_state=closing, target=found, config=config(), now=6.0,
        target_version=4))
    assert code_of(refused) is Code.SENDER_CLOSING and Code.SENDER_CLOSING.value not in outbox.TRANSIENT


# ---- grants, each on its own -------------------------------------------------------------------------------


@pytest.mark.parametrize("operation", peers.OPERATIONS)
def test_each_operation_is_granted_only_by_its_own_flag(operation):
    state = st.fold([grant(**{operation: True}, principal="acme")]).peers
    for other in peers.OPERATIONS:
        authorization = grants.authorize(state, PLANNER.agent_type, PLANNER.session_id, other)
        assert authorization.allowed is (other == operation)
        assert authorization.principal == ("acme" if other == operation else None)


def test_nothing_is_granted_by_default_and_an_unknown_operation_is_a_programming_error():
    for operation in peers.OPERATIONS:
        assert not grants.authorize(st.INITIAL.peers, "planner", PLANNER.session_id, operation).allowed
    with pytest.raises(ValueError):
        grants.authorize(st.INITIAL.peers, "planner", PLANNER.session_id, "delete")


def test_a_sessions_own_grant_replaces_its_types_grant_whole():
    state = st.fold([grant(kind="agent_type", send=True, read=True, principal="team"),
                     grant(read=True, principal="narrowed")]).peers
    assert not grants.authorize(state, "planner", PLANNER.session_id, "send").allowed
    assert grants.authorize(state, "planner", PLANNER.session_id, "read").principal == "narrowed"
    assert grants.authorize(state, "planner", OTHER_PLANNER.session_id, "send").principal == "team"


def test_a_route_without_a_send_grant_is_refused_whatever_else_is_granted():
    found = target(ADVISOR, route(), grant(context=True, read=True, control=True))
    assert code_of(decide(PLANNER, found)) is Code.PEER_NOT_GRANTED


def test_a_send_answers_the_stored_status_never_the_recipients_state():
    # The recipient's state is the destination's to show, later, to a source holding `read` (inspect).
    for granted in (grant(send=True), grant(send=True, read=True)):
        result = decide(PLANNER, target(ADVISOR, route(), granted)).result
        assert result["status"] == "pending" and "recipient_state" not in result


def test_receiving_a_message_grants_no_operation_back_to_its_sender():
    # The advisor received mail from the planner; the planner's own stream holds nothing about the advisor.
    advisor_state = st.fold([registered(ADVISOR), route(), grant(send=True), peer_accepted("m-in", PLANNER)])
    assert len(advisor_state.peers.inbox) == 1
    planner_side = target(PLANNER)
    for operation in peers.OPERATIONS:
        assert not grants.authorize(planner_side.state.peers, "advisor", ADVISOR.session_id, operation).allowed
    reply = decide(ADVISOR, planner_side, peer="planner", reply=True, in_reply_to="m-in",
                   sender_events=(route(), grant(send=True), peer_accepted("m-in", PLANNER)))
    assert code_of(reply) is Code.PEER_UNKNOWN


# ---- replies -------------------------------------------------------------------------------------------------

ADVISOR_HAS_MAIL = (peer_accepted("m-in", PLANNER),)
BACK = (route(source=ADVISOR, name="planner"), grant(source=ADVISOR, send=True, principal="acme/advice"))


def test_a_reply_to_a_real_inbound_reference_from_that_peer_goes_back_over_the_route():
    decision = decide(ADVISOR, target(PLANNER, *BACK), peer="planner", reply=True, in_reply_to="m-in",
                      sender_events=ADVISOR_HAS_MAIL)
    assert isinstance(decision, Accepted), decision
    message = decision.events[-1]
    assert (message.in_reply_to, message.reply, message.principal) == ("m-in", True, "acme/advice")
    assert decision.result["in_reply_to"] == "m-in"


def test_a_reply_to_a_forged_reference_is_refused():
    for reference in ("m-forged", None):
        decision = decide(ADVISOR, target(PLANNER, *BACK), peer="planner", reply=True, in_reply_to=reference,
                          sender_events=ADVISOR_HAS_MAIL)
        assert code_of(decision) is Code.PEER_UNKNOWN_REFERENCE


def test_a_reply_to_a_message_from_another_sender_is_refused_as_foreign():
    decision = decide(ADVISOR, target(PLANNER, *BACK), peer="planner", reply=True, in_reply_to="m-other",
                      sender_events=(peer_accepted("m-other", OTHER_PLANNER),))
    assert code_of(decision) is Code.PEER_FOREIGN_REFERENCE


def test_tree_mail_is_no_reference_a_peer_reply_can_name():
    decision = decide(ADVISOR, target(PLANNER, *BACK), peer="planner", reply=True, in_reply_to="m-tree",
                      sender_events=(accepted("m-tree", PLANNER),))
    assert code_of(decision) is Code.PEER_UNKNOWN_REFERENCE


def test_in_reply_to_on_a_plain_send_is_correlation_only_and_grants_nothing():
    refused = decide(ADVISOR, target(PLANNER, route(source=ADVISOR, name="planner")), peer="planner",
                     in_reply_to="m-in", sender_events=ADVISOR_HAS_MAIL)
    assert code_of(refused) is Code.PEER_NOT_GRANTED
    unchecked = decide(ADVISOR, target(PLANNER, *BACK), peer="planner", in_reply_to="anything")
    assert isinstance(unchecked, Accepted)
    assert (unchecked.events[-1].in_reply_to, unchecked.events[-1].reply) == ("anything", False)


def test_the_inbox_keeps_every_unread_peer_message_with_its_provenance_and_arrival_number():
    events = [peer_accepted(f"m{i}", PLANNER, principal=f"p{i}") for i in range(peers.INBOX_LIMIT + 3)]
    inbox = st.fold([registered(ADVISOR), accepted("tree", OTHER_PLANNER), *events]).peers.inbox
    # Nothing read yet (a stream from before the admission guard): nothing is let go.
    assert len(inbox) == peers.INBOX_LIMIT + 3
    assert inbox[-1] == peers.InboxEntry(f"m{peers.INBOX_LIMIT + 2}", PLANNER.session_id, PLANNER.handle,
                                         f"p{peers.INBOX_LIMIT + 2}", 0.0, None, peers.INBOX_LIMIT + 3)
    assert [e.number for e in inbox] == list(range(1, peers.INBOX_LIMIT + 4))


def test_only_read_entries_make_room_oldest_first_and_an_unread_one_never_goes():
    first = [peer_accepted(f"m{i}", PLANNER) for i in range(peers.INBOX_LIMIT)]
    read = [consumed("m3", PLANNER), discarded("m7", PLANNER), consumed("m9", PLANNER)]
    later = [peer_accepted(f"n{i}", PLANNER) for i in range(2)]
    state = st.fold([registered(ADVISOR), *first, *read, *later])
    ids = [e.message_id for e in state.peers.inbox]
    assert len(ids) == peers.INBOX_LIMIT and "m3" not in ids and "m7" not in ids and "m9" in ids
    assert ids[-2:] == ["n0", "n1"] and state.peers.arrivals == peers.INBOX_LIMIT + 2
    assert peers.unread(state.peers) == peers.INBOX_LIMIT - 1


def test_a_destination_whose_inbox_bound_is_all_unread_refuses_more_peer_mail_for_now():
    base = (route(), grant(send=True))
    [intent] = decide(PLANNER, target(ADVISOR, *base)).events
    full = [peer_accepted(f"m{i}", OTHER_PLANNER) for i in range(peers.INBOX_LIMIT)]
    roomy = config(max_pending_per_session=1000, max_inflight_per_pair=1000)
    refused = admit(PLANNER, target(ADVISOR, *base, *full), intent, cfg=roomy)
    assert code_of(refused) is Code.PEER_INBOX_FULL and Code.PEER_INBOX_FULL.value in outbox.TRANSIENT
    one_read = admit(PLANNER, target(ADVISOR, *base, *full, consumed("m0", OTHER_PLANNER)), intent, cfg=roomy)
    assert isinstance(one_read, Accepted)


def test_inbox_pages_follow_their_cursor_to_the_oldest_entry_while_new_mail_arrives():
    state = st.fold([registered(ADVISOR), *[peer_accepted(f"m{i}", PLANNER) for i in range(30)]])
    seen, before = [], None
    while True:
        entries = list(reversed(state.peers.inbox))
        page, before = peers.page(entries, 10, before)
        seen += [e.message_id for e in page]
        if before is None:
            break
        # Between two pages: what was shown is read, and more mail arrives (the bound is passed).
        state = st.fold([*(consumed(e.message_id, PLANNER) for e in page),
                         *(peer_accepted(f"late{len(seen)}-{i}", PLANNER) for i in range(12))], state)
    assert seen == [f"m{i}" for i in reversed(range(30))]


def test_peer_state_survives_the_snapshot_and_an_empty_one_costs_the_snapshot_nothing():
    state = st.fold([registered(ADVISOR), route(schema=QUESTION), grant(send=True), peer_accepted("m", PLANNER)])
    assert st.SessionState.from_json(state.to_json()) == state
    assert "peers" not in json.loads(st.fold([registered(ADVISOR)]).to_json())


# ---- input schemas -------------------------------------------------------------------------------------------


@pytest.mark.parametrize("body, fragment", [
    ('{"q": "x"}', "'question' is a required property"),
    ('{"question": 3}', "at question: 3 is not of type 'string'"),
    ("plain words", "`body` is not JSON"),
])
def test_an_input_that_does_not_match_the_receivers_schema_is_refused_with_a_stable_code(body, fragment):
    refused = decide(PLANNER, target(ADVISOR, route(schema=QUESTION), grant(send=True)), body=body)
    assert code_of(refused) is Code.PEER_INPUT_MISMATCH and fragment in refused.message
    assert isinstance(decide(PLANNER, target(ADVISOR, route(schema=QUESTION), grant(send=True)),
                             body='{"question": "LRU?"}'), Accepted)


def test_a_schema_reference_that_would_need_the_network_is_refused_not_fetched():
    remote = {"$ref": "https://schemas.invalid/input.json"}
    refused = decide(PLANNER, target(ADVISOR, route(schema=remote), grant(send=True)), body="{}")
    assert code_of(refused) is Code.PEER_INPUT_MISMATCH and "cannot be resolved" in refused.message


# ---- idempotency -------------------------------------------------------------------------------------------


def test_a_retried_peer_call_replays_its_outcome_and_other_arguments_conflict():
    arguments = PeerSendArguments("advisor", "hello")
    recorded = routes.record(arguments, {"ok": {"message_id": "m-1"}})
    assert routes.replayed_outcome(recorded, arguments) == {"ok": {"message_id": "m-1"}}
    other = routes.replayed_outcome(recorded, PeerSendArguments("advisor", "hello", in_reply_to="m-0"))
    assert other["error"]["code"] == Code.PEER_IDEMPOTENCY_CONFLICT.value


def test_peer_mail_keeps_the_cause_it_was_sent_with_whatever_its_run_consumed_before_its_admission():
    from .builders import consumed

    found = target(ADVISOR, route(), grant(send=True))
    helper = session_record("0190a000-0000-7000-8000-0000000000c1", agent_type="helper", rules=[])

    def consumed_by_run_1(*message_ids):
        return [e for mid in message_ids for e in (accepted(mid, helper), claimed(mid, helper, run_id="run-1"),
                                                     consumed(mid, helper, run_id="run-1"))]

    def admitted_with(intent, *later):
        # By the admission the run consumed more: the message's cause is still what it was when it was sent.
        given = peerdelivery.AdmissionGiven(
            intent=intent, sender=PLANNER, target=found, config=config(), now=6.0, target_version=4,
            sender_state=st.fold([registered(PLANNER), run_started("run-1"), *consumed_by_run_1(*later)]))
        decision = peerdelivery.decide_admission(given)
        return next(e for e in decision.events if isinstance(e, ev.ProducerMessageAccepted))

    [caused] = decide(PLANNER, found, sender_events=consumed_by_run_1("c-1")).events
    assert (caused.caused_by, caused.chain_id) == ("c-1", "c-1")
    message = admitted_with(caused, "c-1", "c-2")
    assert (message.caused_by, message.chain_of) == ("c-1", "c-1")

    [first] = decide(PLANNER, found).events  # its run had consumed nothing: it starts its own chain
    assert (first.caused_by, first.chain_id) == (None, "m-1")
    message = admitted_with(first, "c-2")
    assert (message.caused_by, message.chain_id, message.chain_of) == (None, None, "m-1")

    # An intent stored before the cause was recorded takes its run's cause at admission, as before.
    older = first.model_copy(update={"chain_id": None})
    assert admitted_with(older, "c-2").caused_by == "c-2"
