"""A versioned protocol: every entry and command carries `v`; the schema covers the whole protocol and is
bound to its version; readers take older versions and refuse newer ones."""

import json
from pathlib import Path

import pytest

from treemail import PROTOCOL_VERSION
from treemail.adapters.codec import encode_command, parse_command
from treemail.adapters.eventstore import decode_entry
from treemail.consumers.entries import split_malformed
from treemail.domain import events as ev
from treemail.domain import protocol
from treemail.domain.commands import SendArguments, SendContext, SendMessage
from treemail.entrypoints import protocolschema

SCHEMAS = Path(__file__).resolve().parents[2] / "schemas"
COMMAND = SendMessage("c-1", SendContext("s", "r", "t"), SendArguments("explore_00000001", "hi"), "client")


def test_the_checked_in_protocol_schema_matches_the_code():
    assert (SCHEMAS / "protocol.schema.json").read_text() == protocolschema.render(), (
        "the protocol changed: run `.venv/bin/python -m treemail.entrypoints.protocolschema --write` "
        "(after bumping PROTOCOL_VERSION)"
    )


def test_the_schema_did_not_change_without_a_protocol_version_bump():
    versions = json.loads((SCHEMAS / "protocol.versions.json").read_text())
    assert versions.get(str(PROTOCOL_VERSION)) == protocolschema.digest(), (
        f"the protocol schema is not the one recorded for protocol {PROTOCOL_VERSION}: bump PROTOCOL_VERSION, "
        "then run `.venv/bin/python -m treemail.entrypoints.protocolschema --write`"
    )
    assert max(int(v) for v in versions) == PROTOCOL_VERSION


def test_a_changed_event_changes_the_digest_so_the_bump_check_can_fail(monkeypatch):
    before = protocolschema.digest()

    class SessionPaused(ev.Event):
        reason: str

    monkeypatch.setitem(ev.EVENT_TYPES, "SessionPaused", SessionPaused)
    assert protocolschema.digest() != before


def test_writing_the_schema_refuses_to_rebind_a_recorded_version(tmp_path):
    (tmp_path / "protocol.versions.json").write_text(json.dumps({str(PROTOCOL_VERSION): "0" * 64}))
    with pytest.raises(SystemExit, match="bump PROTOCOL_VERSION"):
        protocolschema.write(tmp_path)
    (tmp_path / "protocol.versions.json").write_text("{}")
    protocolschema.write(tmp_path)
    assert json.loads((tmp_path / "protocol.versions.json").read_text()) == {str(PROTOCOL_VERSION): protocolschema.digest()}


def test_the_schema_covers_commands_the_tool_results_errors_wake_triggers_and_events():
    schema = protocolschema.protocol_schemas()
    for part in ("stream_entries", "commands", "reply", "tool", "results", "errors", "wake_trigger", "events"):
        assert schema[part], part
    assert schema["tool"]["input_schema"]["properties"]["body"]["minLength"] == 1
    assert "send_message:inbox_full" in schema["results"]["error"]["properties"]["error"]["properties"]["code"]["enum"]
    for entry in ("session", "feed", "wake", "dead_letter"):
        assert "v" in schema["stream_entries"][entry]["required"], entry
    assert "v" in schema["commands"]["SendMessage"]["required"]


def test_every_command_carries_the_protocol_version():
    assert json.loads(encode_command(COMMAND))["v"] == PROTOCOL_VERSION


def test_a_reader_accepts_older_versions_and_unversioned_commands():
    data = json.loads(encode_command(COMMAND))
    for older in (None, 2, PROTOCOL_VERSION):
        if older is None:
            data.pop("v", None)
        else:
            data["v"] = older
        assert parse_command(json.dumps(data)) == COMMAND


def test_a_reader_refuses_a_newer_command_with_a_clear_error():
    data = {**json.loads(encode_command(COMMAND)), "v": PROTOCOL_VERSION + 1}
    with pytest.raises(protocol.NewerProtocol, match=f"protocol {PROTOCOL_VERSION + 1}.*reads protocol "
                                                     f"{PROTOCOL_VERSION} and older: upgrade it"):
        parse_command(json.dumps(data))
    # the worker sets it aside as newer_protocol, not as malformed
    entries = [(b"1-0", {b"__data__": json.dumps(data).encode()}), (b"2-0", {b"__data__": b"{not json"})]
    parsed, unreadable = split_malformed(entries)
    assert parsed == [] and {letter.entry_id: letter.reason for letter in unreadable} == {
        b"1-0": "newer_protocol", b"2-0": "malformed"}
    # the producer is answered: a newer worker will decide it, so retrying the same tool call is safe
    [newer] = [letter for letter in unreadable if letter.reason == "newer_protocol"]
    assert newer.answer is not None and newer.answer[1]["error"]["code"] == "send_message:engine_shutdown"


def test_a_stream_entry_of_a_newer_protocol_is_skipped_and_older_ones_read():
    name, data = ev.encode(ev.SessionRunStarted(run_id="r"))
    fields = {b"type": name.encode(), b"data": data.encode()}
    assert decode_entry(fields) == ev.SessionRunStarted(run_id="r")  # unversioned: protocol 1
    assert decode_entry({**fields, b"v": str(PROTOCOL_VERSION).encode()}) is not None
    assert decode_entry({**fields, b"v": str(PROTOCOL_VERSION + 1).encode()}) is None
