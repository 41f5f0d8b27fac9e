"""The records kept per send in their least form read back exactly, and the earlier forms still read."""

import json
from dataclasses import replace

import pytest

from treemail.adapters import compact
from treemail.domain import events as ev
from treemail.domain import outbound
from treemail.domain.decide import idempotency
from treemail.domain.state import MailItem

SENDER = "0190e8a4-7b3c-7d2e-9f1a-2b3c4d5e6f70"
MESSAGE = "0190e8a4-7b3c-7d2e-9f1a-000000000001"
ITEM = MailItem(MESSAGE, "agent", SENDER, 0, "steer", "accepted", None, 123, since=1796190271.6113834)


@pytest.mark.parametrize("session_id", [SENDER, "019a2b3c-4d5e-7f60-8a1b-2c3d4e5f6071", "s-1", "~odd", "x" * 15,
                                        "7e90e8a4-7b3c-7d2e-9f1a-2b3c4d5e6f70", SENDER.upper(), "y" * 16, ""])
def test_an_id_reads_back_from_its_feed_and_record_forms(session_id):
    assert compact.id_from_bytes(compact.id_bytes(session_id)) == session_id
    assert compact.id_from_text(compact.id_text(session_id)) == session_id


def test_a_uuid_is_16_bytes_in_a_feed_entry_and_22_characters_in_text():
    assert len(compact.id_bytes(SENDER)) == 16 and len(compact.id_text(SENDER)) == 22
    assert compact.id_bytes("s-1") == b"~s-1"


def test_a_plain_accepted_item_is_its_position_its_budget_start_and_its_sender_in_at_most_64_bytes():
    stored = compact.encode_item(ITEM)
    assert json.loads(stored) == [123, 1796190271.6113834, compact.id_text(SENDER)]
    # Valkey keeps a hash packed while each value is at most 64 bytes (hash-max-listpack-value).
    assert len(stored) <= 64
    assert compact.decode_item(MESSAGE, stored) == ITEM


@pytest.mark.parametrize("item", [
    ITEM,
    replace(ITEM, sender_session_id=None, owner="plugin"),
    replace(ITEM, sender_session_id="s-1", agent_hop=2, mode="queue", state="claimed", run_id="r1"),
    replace(ITEM, attempts=3, claimed_at=5.5, retry_at=9.25, reason="timeout", trace="00-ab", peer=True,
            expires_at=99.0, supersede_key="k", passed=2, urgent=True),
    replace(ITEM, urgent=True),
    replace(ITEM, since=0.0),
    replace(ITEM, state="claimed", run_id="r1", attempts=2, shown=2),
])
def test_every_item_reads_back_as_written(item):
    assert compact.decode_item(item.message_id, compact.encode_item(item)) == item


def test_items_an_earlier_version_wrote_still_read():
    assert compact.decode_item(MESSAGE, ITEM.to_json()) == ITEM  # position first, owner second
    full = [MESSAGE, "agent", SENDER, 0, "steer", "accepted", None, 123, 0, 1796190271.6113834]
    assert compact.decode_item(MESSAGE, json.dumps(full)) == ITEM  # the message id first


def test_a_plain_sends_record_is_44_bytes_and_answers_a_retry_with_its_three_keys():
    outcome = {"ok": {"message_id": MESSAGE, "mode": "steer", "recipient_state": "running"}}
    record = idempotency.kept("0" * 31 + "f", outcome)
    stored = compact.encode_record(record)
    assert len(stored) == 44 and stored[:1] not in "[{"
    assert idempotency.parse(compact.decode_record(stored.encode())) == ("0" * 31 + "f", outcome)


def test_an_accepted_sends_record_is_45_bytes_and_answers_a_retry_exactly():
    outcome = {"ok": {"message_id": MESSAGE, "mode": "steer", "recipient_state": "running", "sequence": 7}}
    record = idempotency.kept("0" * 31 + "f", outcome)
    stored = compact.encode_record(record)
    assert len(stored) == 45 and stored[:1] not in "[{"
    assert compact.decode_record(stored) == record
    assert idempotency.parse(compact.decode_record(stored.encode())) == ("0" * 31 + "f", outcome)


@pytest.mark.parametrize("record", [
    ["a" * 32, MESSAGE, "queue", "queued", 12345],
    ["a" * 32, MESSAGE, "steer", "waking_finished", 1],
    ["a" * 32, MESSAGE, "queue", "running", 0],
    ["a" * 32, MESSAGE, "steer", "running"],  # no sequence: the plain result's record
    ["a" * 32, MESSAGE, "queue", "waking_finished"],
    ["a" * 32, "m-1", "steer", "running", 1],  # not a UUID: kept as JSON
    ["a" * 32, {"error": {"code": "send_message:inbox_full", "message": "full"}}],
    {"fp": "a" * 32, "outcome": {"ok": {"message_id": "m"}}},  # an earlier version's form
])
def test_every_record_reads_back_as_written(record):
    assert compact.decode_record(compact.encode_record(record)) == record


def test_a_record_that_is_not_one_is_a_clear_error():
    with pytest.raises(ValueError, match="not an idempotency record"):
        compact.decode_record("garbage")


def test_an_outbound_index_entry_is_binary_and_reads_back_where_the_record_is():
    pairs = outbound.index_entries(SENDER, [], 1) + [MESSAGE, f"{SENDER} 17", f"{MESSAGE}:settled", f"{SENDER} 42",
                                                     "m-1", "s 1 2"]
    stored = compact.encode_outbound(pairs)
    sent, settled = compact.outbound_fields(MESSAGE)
    assert stored[0::2] == [sent, settled, compact.outbound_fields("m-1")[0]]
    assert len(sent) == 16 and len(stored[1]) == 18
    assert [compact.decode_outbound(v) for v in stored[1::2]] == [(SENDER, 17), (SENDER, 42), ("s 1", 2)]


def test_a_steer_message_and_a_running_recipients_receipt_leave_their_defaults_unwritten_and_old_entries_fold():
    accepted = ev.ProducerMessageAccepted(message_id=MESSAGE, sender_session_id=SENDER, body="b", mode="steer")
    sent = ev.MessageSent(message_id=MESSAGE, recipient_session_id=SENDER, position=4, recipient_state="running")
    assert "mode" not in json.loads(ev.encode(accepted)[1])
    assert "recipient_state" not in json.loads(ev.encode(sent)[1])
    assert ev.decode(*ev.encode(accepted)) == accepted and ev.decode(*ev.encode(sent)) == sent
    # Entries of protocol 5 and earlier always carry both.
    old = ev.decode("MessageSent", json.dumps({"at": 1.0, "message_id": MESSAGE, "recipient_session_id": SENDER,
                                               "position": 4, "recipient_state": "queued"}))
    assert old.recipient_state == "queued"
    queued = replace_event(accepted, mode="queue")
    assert json.loads(ev.encode(queued)[1])["mode"] == "queue" and ev.decode(*ev.encode(queued)).mode == "queue"


def replace_event(event, **changes):
    return event.model_copy(update=changes)


def test_a_tool_calls_record_is_read_under_its_field_first_then_under_the_text_field_an_earlier_version_wrote():
    digest = "313fac707c95f033ecc1ba84ed4a39a3"
    assert compact.record_fields(digest) == (bytes.fromhex(digest), digest)
    new = compact.encode_record([digest, "01a23550-940b-74fc-a4cc-23a96c0ba82a", "steer", "running", 3])
    old = b'["313fac707c95f033ecc1ba84ed4a39a3","01a23550-940b-74fc-a4cc-23a96c0ba82a","queue","idle",1]'
    assert compact.kept_record([new.encode(), old])[4] == 3
    assert compact.kept_record([None, old]) == [digest, "01a23550-940b-74fc-a4cc-23a96c0ba82a", "queue", "idle", 1]
    assert compact.kept_record([None, None]) is None
