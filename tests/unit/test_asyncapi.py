"""The checked-in AsyncAPI document: in sync with the code, mirroring the worker, with real payloads."""

import json
import re
from pathlib import Path

from treemail.adapters.codec import encode_command
from treemail.adapters.config import Config, ServiceConfig
from treemail.adapters.eventstore import wake_trigger
from treemail.adapters.wire import CommandPayload, Reply, WakeTrigger
from treemail.consumers import asyncapi
from treemail.consumers.app import Worker
from treemail.domain.commands import SendArguments, SendContext, SendMessage
from treemail.domain.decide.send import Accepted, AwaitsApproval, Refused, outcome_of
from treemail.domain.errors import Code

from .builders import CHILD_ID, ROOT_ID, session_record

CHECKED_IN = Path(__file__).resolve().parents[2] / "schemas" / "asyncapi.json"
# The AsyncAPI Initiative's own JSON Schema for 3.0.0 (tests/fixtures/asyncapi/README.md says where from).
OFFICIAL = Path(__file__).resolve().parents[1] / "fixtures" / "asyncapi" / "3.0.0.json"


def _official_validator():
    import jsonschema

    return jsonschema.Draft7Validator(json.loads(OFFICIAL.read_text()))


def test_the_document_is_valid_against_the_official_asyncapi_schema_with_every_message_checked():
    doc = json.loads(CHECKED_IN.read_text())
    official = json.loads(OFFICIAL.read_text())
    errors = [f"{'/'.join(map(str, e.absolute_path))}: {e.message}" for e in _official_validator().iter_errors(doc)]
    assert errors == []
    # A message whose key is outside the spec's key pattern is matched by no rule and so never checked: every
    # key must match, which is what makes the validation above cover each message.
    [pattern] = official["definitions"]["components"]["properties"]["messages"]["patternProperties"]
    assert doc["components"]["messages"] and all(re.search(pattern, key) for key in doc["components"]["messages"])
    assert doc["components"]["schemas"] and all(re.search(pattern, key) for key in doc["components"]["schemas"])


def test_the_official_schema_would_catch_a_broken_message_so_the_check_above_is_real():
    doc = json.loads(CHECKED_IN.read_text())
    for name in doc["components"]["messages"]:
        broken = json.loads(CHECKED_IN.read_text())
        broken["components"]["messages"][name]["correlationId"] = 7  # an object in the spec, never a number
        assert list(_official_validator().iter_errors(broken)), name


def test_checked_in_asyncapi_document_matches_the_code():
    assert CHECKED_IN.read_text() == asyncapi.render(), (
        "the worker's channels or payloads changed: regenerate with `treemail asyncapi > schemas/asyncapi.json`"
    )


def test_the_document_has_the_command_reply_and_wake_channels_with_non_empty_payloads():
    doc = json.loads(CHECKED_IN.read_text())
    assert set(doc["channels"]) == {"commands", "replies", "wakes"}
    schemas = doc["components"]["schemas"]
    for message in doc["components"]["messages"].values():
        payload = schemas[message["payload"]["$ref"].rsplit("/", 1)[1]]
        assert payload.get("properties") or payload.get("anyOf"), message["title"]
    assert {op["action"] for op in doc["operations"].values()} == {"receive", "send"}
    assert doc["operations"]["commands"]["action"] == "receive"


def test_documented_command_channel_is_every_stream_the_worker_reads_in_its_group():
    worker = Worker(Config(service=ServiceConfig(command_streams=8)), asyncapi.DOC_URL, consumer="w")
    channel = asyncapi.document()["channels"]["commands"]
    pattern = re.escape(channel["address"]).replace(r"\{shard\}", r"\{c\d+\}")
    for subscriber in worker.subscribers.all:
        assert re.fullmatch(pattern, subscriber.stream_sub.name)
        assert subscriber.stream_sub.group == channel["bindings"]["redis"]["groupName"]
    assert len(worker.subscribers.all) == 8


def test_a_command_as_the_codec_writes_it_is_the_documented_payload():
    command = SendMessage("cmd-1", SendContext(ROOT_ID, "run-1", "call-1"), SendArguments("explore_1", "hi", "queue"),
                          "client-1")
    parsed = CommandPayload.model_validate_json(encode_command(command))
    assert parsed.ctx == (ROOT_ID, "run-1", "call-1") and parsed.args == ("explore_1", "hi", "queue")


def test_every_kind_of_decision_the_worker_answers_is_the_documented_reply():
    ok = {"message_id": "m-1", "mode": "steer", "recipient_state": "running"}
    for decision in (
        Accepted([], ok),
        Refused(Code.INBOX_FULL, "full"),
        AwaitsApproval([], "req-1", "sibling"),
    ):
        # The worker's answer: exactly this dict, dumped as JSON (consumers/app.py, decide_commands).
        answer = json.dumps({"command_id": "cmd-1", **outcome_of(decision)})
        Reply.model_validate_json(answer)


def test_a_wake_trigger_as_the_event_store_writes_it_is_the_documented_payload():
    record = session_record(CHILD_ID, root=ROOT_ID, parent=ROOT_ID)
    WakeTrigger.model_validate_json(wake_trigger(record, "m-1", 7))
    WakeTrigger.model_validate_json(wake_trigger(record, None, 8))
