"""The whole protocol as one JSON Schema: stream entries, commands, the tool, results, errors, wake triggers, events.

``schemas/protocol.schema.json`` is this module's output, checked against the
code by a test. ``schemas/protocol.versions.json`` keeps the digest of the
schema for each protocol version: a test fails when the schema changed and
``PROTOCOL_VERSION`` was not bumped. After a change:

    .venv/bin/python -m treemail.entrypoints.protocolschema --write

rewrites the schema (and ``schemas/events.schema.json``) and records the
digest of the current version; it refuses to change the digest recorded for
a version, which is the reminder to bump ``PROTOCOL_VERSION`` first.

It is a generator run from a source tree, so it lives with the entry points,
above every floor whose messages it describes (the tool definition is the
producers', the events the domain's, whose ``schema.py`` keeps them alone).
"""

import hashlib
import json
import sys
from pathlib import Path

from treemail.domain.protocol import PROTOCOL_VERSION
from treemail.domain.commands import STATUSES
from treemail.domain.errors import Code
from treemail.domain.schema import event_schemas
from treemail.domain.schema import render as render_events

from treemail.producers.tools import send_message as tool

_JSON_TEXT = {"type": "string", "contentMediaType": "application/json"}
_VERSION_FIELD = {"type": "string", "pattern": "^[0-9]+$", "description": "the protocol version that wrote the entry"}
LIFECYCLE_CODES = ["lifecycle:unknown_session", "lifecycle:unknown_message", "lifecycle:not_claimed",
                   "lifecycle:not_current_run", "lifecycle:run_active", "lifecycle:invalid_body",
                   "lifecycle:contention"]


def _entry(description: str, fields: dict, required: list[str], additional: dict | None = None) -> dict:
    entry = {"type": "object", "description": description, "properties": {**fields, "v": _VERSION_FIELD},
             "required": required}
    if additional is not None:
        entry["additionalProperties"] = additional
    return entry


def protocol_schemas() -> dict:
    events = event_schemas()["events"]
    error = {
        "type": "object", "additionalProperties": False, "required": ["error"],
        "properties": {"error": {"type": "object", "required": ["code", "message"], "properties": {
            "code": {"enum": [code.value for code in Code]}, "message": {"type": "string"},
            # Flow control: a refusal that may pass later says when to retry and the occupancy behind it.
            "retry_after_ms": {"type": "integer", "minimum": 0}, "occupancy": {"type": "object"}}}},
    }
    success = {
        "type": "object", "required": ["message_id", "mode", "recipient_state"], "properties": {
            "message_id": {"type": "string"}, "mode": {"enum": list(tool.MODES)},
            "recipient_state": {"enum": ["running", "queued", "waking_finished"]},
            # Order and priority: the message's number in its directed pair, only for a sender with the read
            # receipt tool or a host that asked (`n`); the plain result is exactly the three keys.
            "sequence": {"type": "integer", "minimum": 1}},
    }
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "title": "treemail protocol",
        "protocol_version": PROTOCOL_VERSION,
        "description": (
            "Every stream entry and every command carries `v`, the protocol version that wrote it (absent: "
            "protocol 1, the first release). Readers accept older versions (changes are additive) and refuse "
            "newer ones."
        ),
        "stream_entries": {
            "session": _entry("tm:{pN}:s:<session>:events; the entry id is the event's position `<seq>-0`",
                              {"type": {"enum": sorted(events)}, "data": _JSON_TEXT}, ["type", "data", "v"]),
            "feed": _entry("tm:{pN}:feed: one entry per commit step, naming each session the step appended to "
                           "(the field: a UUID session id as its 16 bytes, any other id as `~` + the id) and the "
                           "positions appended there (`7`, or `7-9` for several); the events, their types included, "
                           "are read from the session streams. An entry of protocol 5 or earlier names one event "
                           "in `session`, `seq` and `type` (some carry a copy in `data`)",
                           {"session": {"type": "string"}, "seq": {"type": "string"}, "type": {"enum": sorted(events)},
                            "data": _JSON_TEXT},
                           ["v"], additional={"type": "string", "pattern": r"^\d+(-\d+)?$"}),
            "wake": _entry("tm:{pN}:wakes: a wake trigger (`data` is a wake_trigger)",
                           {"session": {"type": "string"}, "data": _JSON_TEXT}, ["session", "data", "v"]),
            "command": {"type": "object", "description": "tm:cmd:{cK}: `__data__` is a command (it carries `v`)",
                        "properties": {"__data__": _JSON_TEXT}, "required": ["__data__"]},
            "dead_letter": _entry("tm:cmd:dead: a command set aside, with why",
                                  {"stream": {"type": "string"}, "entry_id": {"type": "string"},
                                   "reason": {"enum": ["malformed", "newer_protocol", "max_deliveries"]},
                                   "consumer": {"type": "string"}, "data": {"type": "string"}},
                                  ["stream", "entry_id", "reason", "data", "v"]),
        },
        "commands": {
            "SendMessage": {
                "type": "object", "required": ["v", "id", "ctx", "args", "reply_to"], "properties": {
                    "v": {"type": "integer", "minimum": 2},
                    "id": {"type": "string"},
                    "ctx": {"type": "array", "prefixItems": [{"type": "string", "title": t} for t in
                                                            ("sender session id", "run id", "tool call id")],
                            "minItems": 3, "maxItems": 3},
                    "args": {"type": "array", "prefixItems": [{"type": "string", "title": "to"},
                                                              {"type": "string", "title": "body"},
                                                              {"enum": list(tool.MODES), "title": "mode"}],
                             "minItems": 3, "maxItems": 3},
                    "reply_to": {"type": "string"},
                    "th": {"type": "array", "prefixItems": [{"type": "string", "title": "in reply to"},
                                                            {"type": ["string", "null"], "title": "thread id"}],
                           "minItems": 2, "maxItems": 2},
                    "u": {"type": "boolean", "title": "urgent (absent for a normal send)"},
                    "n": {"type": "boolean", "title": "the host asked for `sequence` in the result (absent: no)"},
                },
            },
        },
        "reply": {"description": "a worker's answer on tm:reply:<client>: the command id and one outcome",
                  "type": "object", "required": ["command_id"], "properties": {
                      "command_id": {"type": "string"}, "ok": success, "error": error["properties"]["error"],
                      "approval": {"type": "object", "properties": {"request_id": {"type": "string"},
                                                                    "label": {"type": "string"}}}}},
        "wake_trigger": {"type": "object", "required": ["session_id", "root_session_id", "seq"], "properties": {
            "session_id": {"type": "string"}, "root_session_id": {"type": "string"},
            "message_id": {"type": ["string", "null"]}, "seq": {"type": "integer"}}},
        "tool": tool.tool_definition([("*", "allow")]),
        "results": {"success": success, "error": error},
        "errors": {"send_message": [code.value for code in Code], "lifecycle": LIFECYCLE_CODES},
        "statuses": list(STATUSES),
        "events": events,
    }


def render() -> str:
    return json.dumps(protocol_schemas(), indent=2, sort_keys=True, ensure_ascii=False) + "\n"


def digest() -> str:
    """The schema's digest, without the version number itself: what a version is bound to."""
    content = {k: v for k, v in protocol_schemas().items() if k != "protocol_version"}
    return hashlib.sha256(json.dumps(content, sort_keys=True).encode()).hexdigest()


SCHEMAS = Path(__file__).resolve().parents[2] / "schemas"


def write(schemas: Path = SCHEMAS) -> str:
    versions_path = schemas / "protocol.versions.json"
    versions = json.loads(versions_path.read_text()) if versions_path.exists() else {}
    recorded = versions.get(str(PROTOCOL_VERSION))
    if recorded is not None and recorded != digest():
        raise SystemExit(
            f"the protocol schema changed but protocol {PROTOCOL_VERSION} is recorded with another digest: "
            "bump PROTOCOL_VERSION in treemail/domain/protocol.py, then run this again"
        )
    versions[str(PROTOCOL_VERSION)] = digest()
    (schemas / "protocol.schema.json").write_text(render())
    (schemas / "events.schema.json").write_text(render_events())
    versions_path.write_text(json.dumps(dict(sorted(versions.items(), key=lambda kv: int(kv[0]))), indent=2) + "\n")
    return f"protocol {PROTOCOL_VERSION}: {versions[str(PROTOCOL_VERSION)]}"


if __name__ == "__main__":
    if sys.argv[1:] == ["--write"]:
        print(write())
    else:
        sys.stdout.write(render())
