"""The send_message contract, line by line: each test names the contract line it proves. Pure (given/when/then)."""

from dataclasses import replace

import pytest

from treemail.domain import events as ev
from treemail.domain.commands import SendArguments
from treemail.domain.decide import guards, idempotency
from treemail.domain.decide.guards import NoSuchHandle
from treemail.domain.decide.send import Accepted, Refused, Replayed, outcome_of
from treemail.domain.errors import Code, Rejected
from treemail.domain.records import Peer
from treemail.producers.tools.send_message import parse_arguments, result_text, tool_definition

from .builders import (
    ROOT_ID, accepted, config, found, registered, run_finished, run_started, send, session_record, status_changed,
    tree,
)

T = tree()


def body_error(raw) -> Rejected:
    with pytest.raises(Rejected) as caught:
        parse_arguments(raw)
    return caught.value


# ---- "send_message:invalid_body — empty or over max_body_bytes" (blank is empty) --------------


@pytest.mark.parametrize("blank", ["   ", "\n\t", "\u3000 \r\n"])
def test_invalid_body_a_blank_body_fails_while_parsing_the_arguments(blank):
    rejection = body_error({"to": "explore_00000002", "body": blank})
    assert rejection.code is Code.INVALID_BODY


def test_invalid_body_blank_is_checked_before_resolution_and_before_the_master_switch():
    # given messaging disabled and a recipient that does not exist
    target = NoSuchHandle("nobody_00000000", [])
    # when a blank body is sent
    decision = send(T.root, target, body=" \n ", to="nobody_00000000", cfg=config(enabled=False))
    # then the body is what fails, not the switch or the address
    assert isinstance(decision, Refused) and decision.code is Code.INVALID_BODY


def test_invalid_body_argument_errors_still_come_first():
    # a missing `to` is an argument error even when the body is blank
    assert body_error({"body": "  "}).code is Code.INVALID_ARGUMENTS


def test_invalid_body_the_byte_limit_counts_the_untrimmed_body():
    assert isinstance(send(T.root, found(T.child), body=" x ", cfg=config(max_body_bytes=3)), Accepted)
    decision = send(T.root, found(T.child), body="x   ", cfg=config(max_body_bytes=3))
    assert decision.code is Code.INVALID_BODY and "4 bytes" in decision.message


def test_the_tool_schema_body_has_min_length_1():
    schema = tool_definition([("*", "allow")])["input_schema"]
    assert schema["properties"]["body"]["minLength"] == 1


def test_unknown_argument_names_echoed_back_are_bounded():
    raw = {"to": "a_00000000", "body": "x", **{f"k{i:05d}" + "z" * 200: 1 for i in range(1000)}}
    message = body_error(raw).message
    assert len(message) < 600 and "and 995 more" in message


# ---- "recipient_state — running, queued, waking_finished" ("queued durably if idle or queued") ----


def test_recipient_state_an_idle_recipient_reports_queued_and_is_still_woken():
    decision = send(T.root, found(T.child, registered(T.child, status="idle")))
    assert decision.result["recipient_state"] == "queued"
    assert [type(e) for e in decision.events][-1] is ev.SessionWakeRequested


def test_recipient_state_waking_finished_is_only_for_a_finished_recipient():
    states = {}
    for status in ("queued", "running", "idle", "finished"):
        states[status] = send(T.root, found(T.child, registered(T.child, status=status))).result["recipient_state"]
    assert states == {"queued": "queued", "running": "running", "idle": "queued", "finished": "waking_finished"}


# ---- "fails with a self-repairing candidate list ... handle — description — status (session_id <uuid>)" ----


def peer(handle: str, description: str = "", agent_type: str = "explore", status: str = "running", n: int = 9):
    sid = f"0190a000-0000-7000-8000-{n:012d}"
    record = session_record(sid, root=ROOT_ID, parent=ROOT_ID, agent_type=agent_type, handle=handle)
    return Peer(replace(record, description=description, handle=handle), status)


def unknown_reference_message(peers, sender=None, to="nobody_00000000") -> str:
    decision = send(sender or T.root, NoSuchHandle(to, peers), to=to)
    assert decision.code is Code.UNKNOWN_SESSION
    return decision.message


def test_candidate_list_rows_are_sorted_by_handle():
    peers = [peer("zeta_00000001", "z", n=1), peer("alpha_00000002", "a", n=2), peer("mid_00000003", "m", n=3)]
    rows = unknown_reference_message(peers).splitlines()[1:]
    assert [row.split(" — ")[0] for row in rows] == ["- alpha_00000002", "- mid_00000003", "- zeta_00000001"]


def test_candidate_list_renders_the_agent_type_where_the_description_is_empty():
    rows = unknown_reference_message([peer("review_00000001", "", agent_type="review", status="idle", n=1)])
    assert "- review_00000001 — review — idle (session_id 0190a000-0000-7000-8000-000000000001)" in rows


def test_candidate_list_says_none_when_nobody_is_addressable():
    assert unknown_reference_message([]).splitlines()[1:] == ["- (none)"]


def test_candidate_list_is_bounded_and_says_how_many_were_left_out():
    peers = [peer(f"explore_{i:08x}", "d", n=i) for i in range(2000)]
    message = unknown_reference_message(peers)
    rows = message.splitlines()[1:]
    assert len(rows) == guards.CANDIDATE_LIMIT + 1
    assert rows[-1] == f"- … and {2000 - guards.CANDIDATE_LIMIT} more not listed"
    assert len(message) < 10_000


def test_candidate_list_lists_only_addressable_peers():
    # given a child whose rules deny siblings
    sender = T.with_rules("child", [("parent", "allow"), ("sibling", "deny")]).child
    parent = Peer(T.root, "running")
    sibling = Peer(T.sibling, "running")
    rows = unknown_reference_message([parent, sibling], sender=sender).splitlines()[1:]
    assert rows == [f"- {guards.render_peer(parent)}"]


def test_candidate_list_a_pre_handle_peer_prints_its_uuid_once():
    row = guards.render_peer(peer("", "old session", n=7))
    assert row == "0190a000-0000-7000-8000-000000000007 — old session — running"


def test_candidate_list_echoes_a_bounded_reference():
    message = unknown_reference_message([], to="x" * 10_000)
    assert len(message.splitlines()[0]) < 300


# ---- "a retried tool call returns the original message_id ... (existing producer dedup)" --------


def first_outcome():
    first = send(T.root, found(T.child), body="hi", message_id="m-1")
    return idempotency.record(SendArguments(to="explore_00000002", body="hi"), outcome_of(first)), outcome_of(first)


@pytest.mark.parametrize(
    "changed",
    [
        {"cfg": config(enabled=False)},
        {"target": found(T.child, *(accepted(f"m{i}", T.sibling) for i in range(32)))},
        {"sender_events": (registered(T.root), run_started("run-1"), run_finished("run-1"))},
        {"sender_events": (registered(T.root), status_changed("finished"))},
        {"cfg": config(max_body_bytes=1)},
    ],
    ids=["disabled", "inbox_full", "run_finished", "sender_finished", "limit_lowered"],
)
def test_retry_returns_the_original_outcome_whatever_changed_since(changed):
    recorded, original = first_outcome()
    target = changed.pop("target", found(T.child))
    decision = send(T.root, target, body="hi", recorded=recorded, **changed)
    assert decision == Replayed(original)
    assert outcome_of(decision)["ok"]["message_id"] == "m-1"


def test_retry_with_other_arguments_is_still_a_conflict_before_any_check():
    recorded, _ = first_outcome()
    decision = send(T.root, found(T.child), body="other", recorded=recorded, cfg=config(enabled=False))
    assert outcome_of(decision)["error"]["code"] == Code.IDEMPOTENCY_CONFLICT.value


def test_retry_of_a_recorded_refusal_returns_the_refusal_after_room_freed():
    full = found(T.child, *(accepted(f"m{i}", T.sibling) for i in range(32)))
    refusal = send(T.root, full, body="hi")
    assert refusal.code is Code.INBOX_FULL and refusal.recorded
    recorded = idempotency.record(SendArguments(to="explore_00000002", body="hi"), outcome_of(refusal))
    assert outcome_of(send(T.root, found(T.child), body="hi", recorded=recorded)) == outcome_of(refusal)


# ---- what the model reads ---------------------------------------------------------------------


@pytest.mark.parametrize(
    "status, mode, words",
    [("running", "steer", "reads it at its next step"), ("running", "queue", "becomes its next turn"),
     ("idle", "steer", "when its next run starts"), ("finished", "queue", "is woken with the message")],
)
def test_model_text_of_a_success_is_one_line_with_the_accepted_state(status, mode, words):
    result = send(T.root, found(T.child, registered(T.child, status=status)), mode=mode, message_id="m-9").result
    text = result_text(result)
    assert "\n" not in text
    assert text.startswith(f"send_message accepted: message_id=m-9 mode={mode} recipient_state=")
    assert words in text and "not yet read" in text


@pytest.mark.parametrize("code", [c for c in Code if c is not Code.UNKNOWN_SESSION])
def test_model_text_of_an_error_is_code_colon_message_on_one_line(code):
    text = result_text({"error": {"code": code.value, "message": "what happened; what to do"}})
    assert text == f"{code.value}: what happened; what to do"


def test_model_text_of_every_refusal_the_decider_writes_is_code_colon_message():
    for decision in (send(T.child, found(T.child)), send(T.root, found(T.stranger)),
                     send(T.root, found(T.child), cfg=config(enabled=False))):
        text = result_text(outcome_of(decision))
        assert text == f"{decision.code.value}: {decision.message}" and "\n" not in text
