"""The model-facing tools, one row each: how a session's definition is built and how a call is made.

Every adapter that puts treemail in front of a model (the host API's
``tm.tools.call`` and ``tm.tools.schemas``, the MCP server, the tool-schema exporter)
serves what this table installs for the calling session, so a new tool is one
row here and reaches all of them:

    TOOLS["inspect"] = ModelTool(definition=..., call=lambda handlers, context, args: handlers.inspect(...))

``definition(handlers, view)`` returns the canonical definition (``name``,
``description``, ``input_schema``: a JSON Schema object) or None when the
session may not see the tool (deny by default). ``call(handlers, context,
arguments)`` runs it through the host API (``Handlers``: the calls the host's
parts answer, ``producers/host/tools.py`` binds them) with the context the
host bound (session, run, tool call): identity never comes from the arguments.
"""

import json
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from treemail.adapters.config import Config
from treemail.domain.commands import URGENT_SEND, SendContext
from treemail.domain.errors import Code
from treemail.domain.records import SessionRecord
from treemail.domain.state import SessionState
from treemail.domain.results import error_result

from . import interrupt as interrupt_tool
from . import message as message_tools
from . import receipt as receipt_tool
from . import search as search_tool
from . import send_message as tool
from . import subtree as subtree_tool


def error_text(result: dict) -> str:
    return f"{result['error']['code']}: {result['error']['message']}"


@dataclass(frozen=True)
class SessionView:
    """What a tool's definition depends on: the session's record, its state, the deployment's config."""

    record: SessionRecord
    state: SessionState
    config: Config


Call = Callable[[SendContext, Any], Awaitable[dict]]
Definition = Callable[[str], Awaitable[dict | None]]


@dataclass(frozen=True)
class Handlers:
    """What the rows call: the host API's answer to each tool, and the peer tools' definitions by session."""

    send_message: Call
    interrupt_agent: Call
    message_tools: message_tools.Inspector
    peer_send: Call
    peer_reply: Call
    peer_inbox: Call
    peer_send_definition: Definition
    peer_reply_definition: Definition
    peer_inbox_definition: Definition
    # search_mail: the session's own mail, by text, sender and time
    search_mail: Call
    # Whole subtrees: one message to every descendant.
    message_subtree: Call | None = None
    # read_receipt: how far a recipient has read the caller's mail (order and priority)
    read_receipt: Call | None = None


@dataclass(frozen=True)
class ModelTool:
    # The definition this session's model is offered, or None (hidden: no rule, no grant, not installed).
    definition: Callable[[Handlers, SessionView], Awaitable[dict | None]]
    call: Callable[[Handlers, SendContext, Any], Awaitable[dict]]
    # The one-line text a model reads for a successful result (errors read `code: message`).
    text: Callable[[dict], str] = lambda result: json.dumps(result, ensure_ascii=False)


def _ruled(build: Callable[[SessionView], dict | None]):
    """A tool the session's rules govern (always installed): its definition needs no I/O."""
    async def definition(handlers: Handlers, view: SessionView) -> dict | None:
        return build(view)
    return definition


def _installed(name: str, build: Callable[[Handlers, SessionView], Awaitable[dict | None]]):
    """A tool the host installs one by one (``tm.tools.install``), then still subject to its grant."""
    async def definition(handlers: Handlers, view: SessionView) -> dict | None:
        if name not in view.state.installed_tools:
            return None
        return await build(handlers, view)
    return definition


async def _static(definition: dict) -> dict:
    return definition


async def _message_tool(name: str) -> dict:
    return message_tools.tool_definition(name)


TOOLS: dict[str, ModelTool] = {
    # send_message: always there where the session's rules allow it
    tool.TOOL_NAME: ModelTool(
        definition=_ruled(lambda view: tool.tool_definition(
            view.record.rules, view.record.send_message_tool, view.config.messaging.routing,
            view.config.messaging.content_blocks, overlay=view.state.rules_overlay,
            threads=view.config.messaging.threads, mail_control=view.config.messaging.mail_control,
            urgent=URGENT_SEND in view.state.installed_tools,
        )),
        call=lambda handlers, context, arguments: handlers.send_message(context, arguments),
        # The one wording of a send_message result (``send_message.result_text``), whoever renders it.
        text=tool.result_text,
    ),
    # interrupt_agent: the second control tool, where an `interrupt` rule allows it
    interrupt_tool.TOOL_NAME: ModelTool(
        definition=_ruled(lambda view: interrupt_tool.tool_definition(view.record.interrupt_rules)),
        call=lambda handlers, context, arguments: handlers.interrupt_agent(context, arguments),
        text=lambda result: result.get("message") or f"interrupt: {result.get('result')}",
    ),
    # Installed one by one: a sender inspects and retries its own messages ...
    "inspect_message": ModelTool(
        definition=_installed("inspect_message", lambda handlers, view: _message_tool("inspect_message")),
        call=lambda handlers, context, arguments: message_tools.handle(
            handlers.message_tools, "inspect_message", context, arguments),
    ),
    "retry_message": ModelTool(
        definition=_installed("retry_message", lambda handlers, view: _message_tool("retry_message")),
        call=lambda handlers, context, arguments: message_tools.handle(
            handlers.message_tools, "retry_message", context, arguments),
    ),
    # ... takes back one a recipient has not received yet (cancel) ...
    "cancel_message": ModelTool(
        definition=_installed("cancel_message", lambda handlers, view: _message_tool("cancel_message")),
        call=lambda handlers, context, arguments: message_tools.handle(
            handlers.message_tools, "cancel_message", context, arguments),
        text=lambda result: f"message {result['message_id']}: {result['outcome']}",
    ),
    # ... and talks over its peer routes, each tool offered only where a grant allows it.
    "send_to_peer": ModelTool(
        definition=_installed("send_to_peer",
                              lambda handlers, view: handlers.peer_send_definition(view.record.session_id)),
        call=lambda handlers, context, arguments: handlers.peer_send(context, arguments),
    ),
    "reply_to_peer": ModelTool(
        definition=_installed("reply_to_peer",
                              lambda handlers, view: handlers.peer_reply_definition(view.record.session_id)),
        call=lambda handlers, context, arguments: handlers.peer_reply(context, arguments),
    ),
    "peer_inbox": ModelTool(
        definition=_installed("peer_inbox",
                              lambda handlers, view: handlers.peer_inbox_definition(view.record.session_id)),
        call=lambda handlers, context, arguments: handlers.peer_inbox(context, arguments),
    ),
    # ... and searches the mail it sent and received.
    search_tool.TOOL_NAME: ModelTool(
        definition=_installed(search_tool.TOOL_NAME, lambda handlers, view: _static(search_tool.tool_definition())),
        call=lambda handlers, context, arguments: handlers.search_mail(context, arguments),
        text=search_tool.result_text,
    ),
    # ... and, installed, sends one message to every agent below it.
    subtree_tool.TOOL_NAME: ModelTool(
        definition=_installed(subtree_tool.TOOL_NAME, lambda handlers, view: _static(subtree_tool.tool_definition())),
        call=lambda handlers, context, arguments: handlers.message_subtree(context, arguments),
        text=subtree_tool.result_text,
    ),
    # ... and asks how far a recipient has read what it sent.
    receipt_tool.TOOL_NAME: ModelTool(
        definition=_installed(receipt_tool.TOOL_NAME, lambda handlers, view: _static(receipt_tool.tool_definition())),
        call=lambda handlers, context, arguments: handlers.read_receipt(context, arguments),
        text=receipt_tool.result_text,
    ),
}


async def definitions(handlers: Handlers | None, view: SessionView) -> list[dict]:
    """The definitions of every tool this session may see, in table order."""
    found = [await row.definition(handlers, view) for row in TOOLS.values()]
    return [definition for definition in found if definition is not None]


async def installed_tool(handlers: Handlers, name: str, view: SessionView) -> tuple[ModelTool, dict] | None:
    """The row and definition of ``name`` if the session has that tool installed; None: an unknown tool."""
    row = TOOLS.get(name)
    definition = await row.definition(handlers, view) if row is not None else None
    return None if definition is None else (row, definition)


async def call(handlers: Handlers, view: SessionView, context: SendContext, name: str, arguments: Any) -> dict:
    """Run the tool ``name`` for the session in ``context``; a tool it cannot see is unknown, not forbidden."""
    found = await installed_tool(handlers, name, view)
    if found is None:
        return error_result(Code.UNKNOWN_TOOL.value, f"no tool named {name!r} is installed for this session")
    row, definition = found
    return await row.call(handlers, context, without_null_optionals(definition, arguments))


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
