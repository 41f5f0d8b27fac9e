"""Threads: a tree message may name the message it answers (host-enabled) and joins its thread."""

import dataclasses
import json

import pytest

from treemail.adapters.codec import InvalidCommand, encode_command, parse_command
from treemail.domain import events as ev
from treemail.domain.commands import SendArguments, SendContext, SendMessage
from treemail.domain.decide.send import thread
from treemail.domain.errors import Rejected
from treemail.producers.tools import send_message as tool

PLAIN = SendMessage("cmd-1", SendContext("s", "r", "c"), SendArguments("explore_1a2b3c4d", "hi"), "client")
ANSWER = dataclasses.replace(PLAIN, arguments=SendArguments("explore_1a2b3c4d", "hi", in_reply_to="m-1",
                                                            thread_id="m-0"))


def test_an_answer_survives_the_wire_and_a_plain_send_is_encoded_as_before():
    assert parse_command(encode_command(ANSWER)) == ANSWER
    assert "th" not in json.loads(encode_command(PLAIN))
    data = json.loads(encode_command(ANSWER))
    data["th"] = ["m-1"]
    with pytest.raises(InvalidCommand, match="`th` must be"):
        parse_command(json.dumps(data))


def test_an_answer_joins_the_thread_of_what_it_answers_and_anything_else_starts_its_own():
    assert thread(ANSWER.arguments) == {"in_reply_to": "m-1", "thread_id": "m-0"}
    assert thread(SendArguments("x", "y", in_reply_to="m-1")) == {"in_reply_to": "m-1", "thread_id": "m-1"}
    assert thread(PLAIN.arguments) == {}
    alone = ev.ProducerMessageAccepted(message_id="m-9", body="b", mode="steer", sender_session_id="s")
    assert alone.thread_of == "m-9"
    assert ev.ProducerMessageAccepted(message_id="m-10", body="b", mode="steer", sender_session_id="s",
                                      thread_id="m-9").thread_of == "m-9"


def test_the_default_tool_is_unchanged_and_in_reply_to_is_offered_only_when_the_host_enables_threads():
    plain = tool.tool_definition([("*", "allow")])
    assert set(plain["input_schema"]["properties"]) == {"to", "body", "mode"}
    threaded = tool.tool_definition([("*", "allow")], threads=True)
    assert set(threaded["input_schema"]["properties"]) == {"to", "body", "mode", "in_reply_to"}
    assert threaded["input_schema"]["required"] == ["to", "body"]

    with pytest.raises(Rejected) as refused:
        tool.parse_arguments({"to": "a", "body": "b", "in_reply_to": "m-1"})
    assert refused.value.code.value == "send_message:invalid_arguments"
    assert tool.parse_arguments({"to": "a", "body": "b", "in_reply_to": " m-1 "}, threads=True).in_reply_to == "m-1"
    with pytest.raises(Rejected):
        tool.parse_arguments({"to": "a", "body": "b", "in_reply_to": 7}, threads=True)
