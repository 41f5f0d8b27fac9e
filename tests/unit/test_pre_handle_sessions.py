"""Sessions without a handle (pre-handle sessions): addressed, listed and replied to by UUID."""

from dataclasses import replace

from treemail.adapters.eventstore import NO_HANDLE, registration_arg
from treemail.domain import events as ev
from treemail.domain import state as sm
from treemail.domain.decide.guards import NoSuchHandle
from treemail.domain.decide.send import Accepted, AwaitsApproval, Refused
from treemail.domain.envelope import render_agent_message
from treemail.domain.errors import Code
from treemail.domain.records import Peer, SessionRecord

from .builders import found, registered, run_started, send, tree

T = tree()
OLD_CHILD = replace(T.child, handle=None)  # registered before handles existed


def test_a_pre_handle_peer_is_listed_by_its_uuid_once_in_the_candidate_list():
    peers = [Peer(OLD_CHILD, "idle"), Peer(T.sibling, "running")]
    decision = send(T.root, NoSuchHandle("explore_deadbeef", peers), to="explore_deadbeef")

    assert isinstance(decision, Refused) and decision.code is Code.UNKNOWN_SESSION
    [old_line] = [line for line in decision.message.splitlines() if OLD_CHILD.session_id in line]
    assert old_line == f"- {OLD_CHILD.session_id} — {OLD_CHILD.description} — idle"
    assert decision.message.count(OLD_CHILD.session_id) == 1
    assert "None" not in decision.message


def test_a_pre_handle_sender_sends_with_no_handle_in_its_event_and_is_replied_to_by_uuid():
    decision = send(OLD_CHILD, found(T.root), sender_events=(registered(OLD_CHILD), run_started("run-1")),
                    to=T.root.session_id)

    assert isinstance(decision, Accepted)
    [message] = [e for e in decision.events if isinstance(e, ev.ProducerMessageAccepted)]
    assert message.sender_handle is None and message.sender_session_id == OLD_CHILD.session_id
    text = render_agent_message(message.sender_handle or message.sender_session_id, message.body, reply_hint=True)
    assert text.startswith(f'<agent_message from="{OLD_CHILD.session_id}">')
    assert f'send_message(to="{OLD_CHILD.session_id}", ...)' in text


def test_a_pre_handle_session_can_open_and_be_named_in_an_approval_request():
    asking = replace(OLD_CHILD, rules=[("sibling", "ask")])
    old_sibling = replace(T.sibling, handle=None)
    decision = send(asking, found(old_sibling), sender_events=(registered(asking), run_started("run-1")),
                    to=old_sibling.session_id)

    assert isinstance(decision, AwaitsApproval)
    [request] = decision.events
    assert (request.sender_handle, request.recipient_handle) == (asking.session_id, old_sibling.session_id)


def test_a_registration_without_a_handle_still_joins_its_tree_and_reserves_no_handle():
    applied = sm.apply(sm.INITIAL, {}, [registered(OLD_CHILD)], 0)
    assert applied.registers and applied.handle is None
    assert registration_arg(applied) == NO_HANDLE
    with_handle = sm.apply(sm.INITIAL, {}, [registered(T.child)], 0)
    assert registration_arg(with_handle) == T.child.handle
    assert registration_arg(sm.apply(applied.state, {}, [ev.SessionStatusChanged(status="idle")], 1)) == ""


def test_a_pre_handle_record_round_trips_and_its_address_is_its_uuid():
    assert SessionRecord.from_json(OLD_CHILD.to_json()) == OLD_CHILD
    assert OLD_CHILD.address == OLD_CHILD.session_id and T.child.address == T.child.handle
