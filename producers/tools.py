"""The model-facing tools, one row each: how a session's definition is built and how a call is made.

Every adapter that puts treemail in front of a model (the host API's
``call_tool`` and ``tool_schemas``, the MCP server, the tool-schema exporter)
serves what this table installs for the calling session, so a new tool is one
row here and reaches all of them:

    TOOLS["inspect"] = ModelTool(definition=..., call=lambda host, context, args: host.inspect(context, args))

``definition(record, config, overlay)`` returns the canonical definition (``name``,
``description``, ``input_schema``: a JSON Schema object) or None when the
session may not see the tool (deny by default). ``call(host, context,
arguments)`` runs it through the host API with the context the host bound
(session, run, tool call): identity never comes from the arguments.
"""

import json
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from treemail.adapters.config import Config
from treemail.adapters.tokens import TokenBinding
from treemail.domain.commands import SendContext
from treemail.domain.errors import Code
from treemail.domain.records import SessionRecord
from treemail.domain.results import error_result

from . import interrupt_tool, tool


def error_text(result: dict) -> str:
    return f"{result['error']['code']}: {result['error']['message']}"


def send_message_text(result: dict) -> str:
    return (
        f"message {result['message_id']} accepted ({result['mode']}); recipient is {result['recipient_state']}. "
        "Replies arrive as new messages."
    )


@dataclass(frozen=True)
class ModelTool:
    # (the session's record, the deployment's config, the host's overlay of the session's message rules)
    definition: Callable[[SessionRecord, Config, tuple], dict | None]
    call: Callable[[Any, SendContext, Any], Awaitable[dict]]
    # The one-line text a model reads for a successful result (errors read `code: message`).
    text: Callable[[dict], str] = lambda result: json.dumps(result, ensure_ascii=False)


TOOLS: dict[str, ModelTool] = {
    # send_message (seed 000)
    tool.TOOL_NAME: ModelTool(
        definition=lambda record, config, overlay: tool.tool_definition(
            record.rules, record.send_message_tool, config.messaging.routing, config.messaging.content_blocks,
            overlay=overlay,
        ),
        call=lambda host, context, arguments: host.send_message(context, arguments),
        text=send_message_text,
    ),
    # interrupt_agent (seed 002)
    interrupt_tool.TOOL_NAME: ModelTool(
        definition=lambda record, config, overlay: interrupt_tool.tool_definition(record.interrupt_rules),
        call=lambda host, context, arguments: host.interrupt_agent(context, arguments),
        text=lambda result: result.get("message") or f"interrupt: {result.get('result')}",
    ),
}


async def overlay_of(host, record: SessionRecord) -> tuple:
    """The host's run-time overlay of the session's message rules (an event on its stream)."""
    return tuple((await host.store.load(record)).state.rules_overlay)


def installed(record: SessionRecord, config: Config, overlay: tuple = ()) -> list[dict]:
    """The definitions of every tool this session may see, in table order."""
    found = (row.definition(record, config, overlay) for row in TOOLS.values())
    return [definition for definition in found if definition is not None]


def installed_tool(
    name: str, record: SessionRecord, config: Config, overlay: tuple = ()
) -> tuple[ModelTool, dict] | None:
    """The row and definition of ``name`` if the session has that tool installed; None: an unknown tool."""
    row = TOOLS.get(name)
    definition = row.definition(record, config, overlay) if row is not None else None
    return None if definition is None else (row, definition)


async def call(host, context: SendContext, name: str, arguments: Any) -> dict:
    """Run the tool ``name`` for the session in ``context``; a tool it cannot see is unknown, not forbidden."""
    record = await host.sessions.record(context.session_id)
    found = installed_tool(name, record, host.config, await overlay_of(host, record))
    if found is None:
        return error_result(Code.UNKNOWN_TOOL.value, f"no tool named {name!r} is installed for this session")
    row, definition = found
    return await row.call(host, context, without_null_optionals(definition, arguments))


def without_null_optionals(definition: dict, arguments: Any) -> Any:
    """OpenAI's strict mode makes every property required and sends null for an omitted optional one.

    Null for a property the canonical schema does not require reads as
    absent; anything else (text, non-objects, null for a required property) is
    left for the tool's own strict parser to judge.
    """
    if isinstance(arguments, (str, bytes, bytearray)):
        try:
            decoded = json.loads(arguments)
        except (ValueError, UnicodeDecodeError, RecursionError):
            return arguments
        if not isinstance(decoded, dict):
            return arguments
        arguments = decoded
    if not isinstance(arguments, dict):
        return arguments
    required = set(definition["input_schema"].get("required", ()))
    return {k: v for k, v in arguments.items() if not (v is None and k not in required)}


def result_text(name: str, result: dict) -> str:
    """What the model reads for ``result``: ``code: message`` for an error, the tool's line otherwise."""
    if "error" in result:
        return error_text(result)
    row = TOOLS.get(name)
    return row.text(result) if row else json.dumps(result, ensure_ascii=False)


async def bound_context(host, binding: TokenBinding, tool_call_id: str) -> SendContext:
    """The context of one call made through a binding (an MCP token, or the session a stdio server serves).

    The run is the binding's when it names one; otherwise the session's
    current run at the time of the call. With no run open, a run named after
    the binding, which is never live: a send or an interrupt through it is
    refused (``sender_not_live``, seed 002), and tools that need no run
    (inbox, inspect) work as before.
    """
    run_id = binding.run_id
    if run_id is None:
        record = await host.sessions.record(binding.session_id)
        run_id = (await host.store.load(record)).state.current_run or f"mcp:{binding.binding_id}"
    return SendContext(binding.session_id, run_id, tool_call_id)
