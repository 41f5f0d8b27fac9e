"""Content blocks: parsing, the size over every block, the image check and its second look, old events. Pure."""

import base64
import hashlib
import json
from dataclasses import replace

import pytest

from treemail.adapters.codec import encode_command, parse_command
from treemail.domain import blocks
from treemail.domain import events as ev
from treemail.domain import state as st
from treemail.domain.commands import SendArguments, SendContext, SendMessage
from treemail.domain.decide import content, idempotency
from treemail.domain.decide.send import Accepted, Refused, SendGiven, approval_fingerprint, decide_send
from treemail.domain.errors import Code, Rejected
from treemail.domain.records import SessionRecord
from treemail.producers.tools.send_message import parse_arguments, tool_definition

from .builders import config, found, registered, run_started, tree

PNG = base64.b64encode(b"\x89PNG\r\n\x1a\n" + b"\0" * 24).decode()
IMAGE = {"type": "image", "media_type": "image/png", "data": PNG}
ON = config(content_blocks=True)


def with_blocks(raw) -> SendArguments:
    return parse_arguments({"to": "explore_00000002", "body": raw}, content_blocks=True)


def decide(sender, target, arguments: SendArguments, cfg=ON):
    command = SendMessage("cmd-1", SendContext(sender.session_id, "run-1", "call-1"), arguments, "client-1")
    # The sender sends from its open run (only the exact live sender may send).
    given = SendGiven(sender=sender, sender_state=st.fold([registered(sender), run_started("run-1")]), target=target,
                      config=cfg,
                      new_id="m-1", now=1.0)
    return decide_send(command, given)


def image_capable(record: SessionRecord) -> SessionRecord:
    return replace(record, accepts_images=True)


def code_of(decision) -> Code:
    assert isinstance(decision, Refused), decision
    return decision.code


# ---- the image check -----------------------------------------------------------------------------------


def test_an_image_reaches_a_recipient_whose_model_accepts_images_and_is_stored_with_the_message():
    t = tree()
    arguments = with_blocks([{"type": "text", "text": "the chart:"}, IMAGE])
    decision = decide(t.root, found(image_capable(t.child)), arguments)
    assert isinstance(decision, Accepted)
    message = decision.events[-1]
    assert message.blocks == [{"type": "text", "text": "the chart:"}, IMAGE]
    assert message.body == "the chart:\n\n[image 1]"


def test_an_image_for_a_model_without_images_is_refused_with_its_code():
    t = tree()
    decision = decide(t.root, found(t.child), with_blocks([IMAGE]))
    assert code_of(decision) is Code.MODEL_DOES_NOT_SUPPORT_IMAGES
    assert decision.code.value == "send_message:model_does_not_support_images"
    assert t.child.handle in decision.message
    # Text blocks alone need no image capability.
    assert isinstance(decide(t.root, found(t.child), with_blocks([{"type": "text", "text": "hi"}])), Accepted)


def test_the_recipient_is_checked_again_after_the_capability_check(monkeypatch):
    looks: list[str] = []
    real = content.require_recipient

    def recorded(sender, target):
        looks.append("recipient")
        return real(sender, target)

    monkeypatch.setattr(content, "require_recipient", recorded)
    t = tree()
    content.require_image_capable(t.root, found(image_capable(t.child)), with_blocks([IMAGE]))
    assert looks == ["recipient", "recipient"]
    looks.clear()
    with pytest.raises(Rejected):
        content.require_image_capable(t.root, found(t.child), with_blocks([IMAGE]))
    assert looks == ["recipient"]  # refused by the capability check: no delivery, so no second look


# ---- the size counts every block -----------------------------------------------------------------------------


def test_the_size_limit_counts_text_image_data_and_urls():
    t = tree()
    url = {"type": "image", "url": "https://example.com/c.png"}
    arguments = with_blocks([{"type": "text", "text": "héllo"}, IMAGE, url])
    size = len("héllo".encode()) + len(PNG) + len(url["url"])
    assert blocks.size(arguments.blocks) == size
    target = found(image_capable(t.child))
    assert isinstance(decide(t.root, target, arguments, config(content_blocks=True, max_body_bytes=size)), Accepted)
    over = decide(t.root, target, arguments, config(content_blocks=True, max_body_bytes=size - 1))
    assert code_of(over) is Code.INVALID_BODY and "counting every block" in over.message


def test_blocks_with_nothing_in_them_are_an_empty_body():
    t = tree()
    assert code_of(decide(t.root, found(t.child), with_blocks([{"type": "text", "text": ""}]))) is Code.INVALID_BODY


def test_a_worker_with_blocks_off_refuses_them_whatever_the_producer_allowed():
    t = tree()
    decision = decide(t.root, found(image_capable(t.child)), with_blocks([IMAGE]), cfg=config())
    assert code_of(decision) is Code.INVALID_ARGUMENTS


# ---- the tool surface ------------------------------------------------------------------------------------------------


def test_blocks_are_off_by_default_and_the_schema_says_so_when_on():
    with pytest.raises(Rejected) as caught:
        parse_arguments({"to": "a_00000000", "body": [IMAGE]})
    assert caught.value.code is Code.INVALID_ARGUMENTS
    assert parse_arguments({"to": "a_00000000", "body": "plain"}, content_blocks=True).blocks is None
    body = tool_definition([("*", "allow")], content_blocks=True)["input_schema"]["properties"]["body"]
    assert body["anyOf"][0] == {"type": "string", "minLength": 1} and body["anyOf"][1]["type"] == "array"
    assert "images" in tool_definition([("*", "allow")], content_blocks=True)["description"]


@pytest.mark.parametrize("bad", [
    [],
    ["text"],
    [{"type": "video", "url": "https://x"}],
    [{"type": "text"}],
    [{"type": "text", "text": 3}],
    [{"type": "text", "text": "a", "extra": 1}],
    [{"type": "image", "media_type": "image/png", "data": "not base64!"}],
    [{"type": "image", "media_type": "image/tiff", "data": PNG}],
    [{"type": "image", "data": PNG}],
    [{"type": "image", "media_type": "image/png", "data": ""}],
    [{"type": "image", "url": "file:///etc/passwd"}],
    [{"type": "image", "url": "https://x", "data": PNG}],
    [{"type": "text", "text": "a"}] * 65,
])
def test_malformed_blocks_are_invalid_arguments(bad):
    with pytest.raises(Rejected) as caught:
        with_blocks(bad)
    assert caught.value.code is Code.INVALID_ARGUMENTS


# ---- fingerprints, the wire, older events ----------------------------------------------------------------------------


def test_fingerprints_cover_the_images_and_plain_fingerprints_are_unchanged():
    plain = SendArguments("a_00000000", "hi", "steer")
    assert idempotency.fingerprint(plain) == hashlib.sha256(
        json.dumps(["a_00000000", "hi", "steer"]).encode()).hexdigest()[:32]
    one = with_blocks([IMAGE])
    other = with_blocks([{**IMAGE, "data": base64.b64encode(b"another").decode()}])
    assert one.body == other.body
    assert idempotency.fingerprint(one) != idempotency.fingerprint(other)
    assert approval_fingerprint("r", one) != approval_fingerprint("r", other)


def test_the_command_carries_blocks_and_a_plain_command_is_encoded_as_before():
    arguments = with_blocks([{"type": "text", "text": "x"}, IMAGE])
    command = SendMessage("c", SendContext("s", "r", "t"), arguments, "client")
    assert parse_command(encode_command(command)) == command
    plain = SendMessage("c", SendContext("s", "r", "t"), SendArguments("a_00000000", "hi", "queue"), "client")
    assert json.loads(encode_command(plain))["args"] == ["a_00000000", "hi", "queue"]


def test_an_old_format_accepted_event_still_reads_as_a_plain_message():
    old = ('{"at": 1.0, "message_id": "m", "producer_id": "agent:s", "owner": "agent", "sender_session_id": "s", '
           '"sender_handle": "explore_00000001", "body": "hello", "mode": "steer", "agent_hop": 0}')
    event = ev.decode("ProducerMessageAccepted", old)
    assert event.blocks is None and event.body == "hello"
    assert blocks.image_parts(event.blocks) == []
    registration = ev.decode("SessionRegistered", json.dumps({
        "session_id": "s", "root_session_id": "s", "parent_session_id": None, "agent_type": "a",
        "description": "", "handle": "a_00000001", "rules": [], "send_message_tool": True, "status": "idle"}))
    assert (registration.resident, registration.continuable, registration.accepts_images,
            registration.interrupt_rules) == (True, True, False, [])
    record = json.loads(tree().child.to_json())
    for name in ("resident", "continuable", "accepts_images", "interrupt_rules"):
        del record[name]
    assert SessionRecord.from_json(json.dumps(record)) == tree().child


def test_image_parts_are_numbered_like_their_markers():
    stored = blocks.to_json(with_blocks([IMAGE, {"type": "text", "text": "and"},
                                         {"type": "image", "url": "https://e.com/b.png"}]).blocks)
    assert blocks.text_of(blocks.from_json(stored)) == "[image 1]\n\nand\n\n[image 2]"
    assert blocks.image_parts(stored) == [{**IMAGE, "index": 1},
                                          {"type": "image", "url": "https://e.com/b.png", "index": 2}]
