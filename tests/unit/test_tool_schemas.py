"""The tool registry and its exports: each shape is checked by its own SDK's types.

Anthropic and OpenAI ship their request shapes as TypedDicts (``anthropic.types.ToolParam``,
``openai.types.chat.ChatCompletionFunctionToolParam``); pydantic validates the field types and
``typed_dict_check`` adds what a TypedDict does not enforce by itself: no unknown key, every
``Required`` key present. MCP ships pydantic models (``mcp.types.Tool``).
"""

import asyncio
import json
from dataclasses import replace
from typing import Required, get_origin, get_type_hints

import pytest
from anthropic.types import ToolParam
from mcp import types as mcp_types
from openai.types.chat import ChatCompletionFunctionToolParam
from openai.types.shared_params import FunctionDefinition
from pydantic import TypeAdapter

from treemail.adapters.config import Config
from treemail.domain.state import fold
from treemail.producers.tools import message as message_tools
from treemail.producers.tools import schemas as toolschemas
from treemail.producers.tools import send_message as tool
from treemail.producers.tools import table as tools

from .builders import ALLOW_ALL, ROOT_ID, registered, session_record


def typed_dict_check(kind, value: dict) -> None:
    hints = get_type_hints(kind, include_extras=True)
    assert set(value) <= set(hints), f"keys {set(value) - set(hints)} are not part of {kind.__name__}"
    required = {k for k, hint in hints.items() if get_origin(hint) is Required}
    assert required <= set(value), f"{kind.__name__} requires {required - set(value)}"
    TypeAdapter(kind).validate_python(value)


def installed(rules=ALLOW_ALL, send_message_tool=True, installed_tools=()) -> list[dict]:
    """The session's tools, from its record and folded state alone (no optional tool needs I/O unless installed)."""
    record = session_record(ROOT_ID, rules=rules, send_message_tool=send_message_tool)
    state = replace(fold([registered(record)]), installed_tools=tuple(installed_tools))
    return asyncio.run(tools.definitions(tools.SessionView(record, state, Config())))


def test_send_message_is_the_first_row_and_its_definition_is_the_default_tool():
    assert list(tools.TOOLS)[0] == "send_message"
    assert installed() == [tool.tool_definition(ALLOW_ALL)]


def test_a_session_without_allow_or_ask_rules_has_no_tool_installed():
    assert installed(rules=[]) == []
    assert installed(rules=[("*", "deny")]) == []
    assert installed(send_message_tool=False) == []


def test_anthropic_export_is_an_anthropic_tool_param():
    (exported,) = toolschemas.export(installed(), "anthropic")
    typed_dict_check(ToolParam, exported)
    assert exported["input_schema"] == installed()[0]["input_schema"]


def test_mcp_export_is_an_mcp_tool_with_every_field_recognized():
    (exported,) = toolschemas.export(installed(), "mcp")
    model = mcp_types.Tool.model_validate(exported)
    assert model.model_dump(by_alias=True, exclude_none=True) == exported
    assert model.input_schema == installed()[0]["input_schema"]


def test_openai_export_is_a_strict_function_tool():
    (exported,) = toolschemas.export(installed(), "openai")
    typed_dict_check(ChatCompletionFunctionToolParam, exported)
    typed_dict_check(FunctionDefinition, exported["function"])
    function = exported["function"]
    assert function["strict"] is True
    params = function["parameters"]
    # What strict mode requires: closed objects, every property required, optional ones nullable.
    assert params["additionalProperties"] is False
    assert params["required"] == list(params["properties"]) == ["to", "body", "mode"]
    assert params["properties"]["mode"]["type"] == ["string", "null"]
    assert params["properties"]["mode"]["enum"] == ["steer", "queue", None]
    assert all(set(p) <= toolschemas.STRICT_KEYWORDS for p in params["properties"].values())


def test_openai_export_turns_strict_off_rather_than_drop_a_keyword_strict_mode_lacks():
    definition = installed()[0]
    definition["input_schema"]["properties"]["body"]["maxLength"] = 100
    (exported,) = toolschemas.export([definition], "openai")
    assert exported["function"]["strict"] is False
    assert exported["function"]["parameters"] == definition["input_schema"]


def test_openai_strict_export_says_in_words_that_to_and_body_must_not_be_empty():
    """minLength, which strict mode refuses, is enforced by treemail's own argument check instead."""
    assert installed()[0]["input_schema"]["properties"]["body"]["minLength"] == 1
    (exported,) = toolschemas.export(installed(), "openai")
    properties = exported["function"]["parameters"]["properties"]
    assert exported["function"]["strict"] is True
    assert "minLength" not in properties["body"] and properties["body"]["description"].endswith("Not empty.")


def test_an_open_object_is_never_exported_as_strict():
    definition = installed()[0]
    del definition["input_schema"]["additionalProperties"]
    assert toolschemas.strict_schema(definition["input_schema"]) is None


def test_an_unknown_format_is_refused_with_the_formats_named():
    with pytest.raises(ValueError, match="anthropic, openai, mcp"):
        toolschemas.export(installed(), "gemini")


def test_null_for_an_optional_argument_reads_as_omitted_and_nothing_else_changes():
    definition = installed()[0]
    given = {"to": "explore_1a2b3c4d", "body": "hi", "mode": None}
    assert tools.without_null_optionals(definition, given) == {"to": "explore_1a2b3c4d", "body": "hi"}
    assert tools.without_null_optionals(definition, json.dumps(given)) == {"to": "explore_1a2b3c4d", "body": "hi"}
    # Null for a required argument is left for the strict parser to refuse.
    assert tools.without_null_optionals(definition, {"to": None, "body": "hi"}) == {"to": None, "body": "hi"}
    assert tools.without_null_optionals(definition, "not json") == "not json"
    assert tools.without_null_optionals(definition, [1]) == [1]


def test_the_model_reads_code_colon_message_for_an_error_and_one_line_for_a_send():
    error = {"error": {"code": "send_message:inbox_full", "message": "the recipient's inbox is full"}}
    assert tools.result_text("send_message", error) == "send_message:inbox_full: the recipient's inbox is full"
    ok = {"message_id": "m-1", "mode": "queue", "recipient_state": "waking_finished"}
    text = tools.result_text("send_message", ok)
    assert "\n" not in text and "m-1" in text and "waking_finished" in text


def test_a_send_message_result_has_one_wording_whoever_renders_it():
    """The host's send_message_for_model, MCP (the table) and the exported result_text say the same words."""
    from treemail.host import result_text
    from treemail.producers.tools import send_message

    for state in ("running", "queued", "waking_finished"):
        for mode in ("steer", "queue"):
            ok = {"message_id": "m-1", "mode": mode, "recipient_state": state}
            assert tools.result_text("send_message", ok) == send_message.result_text(ok) == result_text(
                "send_message", ok)


def test_optional_tools_are_offered_only_once_installed_and_then_in_table_order():
    assert [t["name"] for t in installed()] == ["send_message"]
    chosen = installed(installed_tools=("retry_message", "inspect_message"))
    assert [t["name"] for t in chosen] == ["send_message", "inspect_message", "retry_message"]
    assert chosen[1] == message_tools.tool_definition("inspect_message")
    # Installed but with no rule allowing a send: send_message stays hidden, the installed tools are offered.
    assert [t["name"] for t in installed(rules=[], installed_tools=("inspect_message",))] == ["inspect_message"]

