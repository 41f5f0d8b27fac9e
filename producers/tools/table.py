"""The model-facing tools, one row each: what each tool is for a session and how a call is made.

Every adapter that puts treemail in front of a model (the host API's
``tm.tools.call`` and ``tm.tools.schemas``, the MCP server, the tool-schema exporter)
serves what this table installs for the calling session, so a new tool is one
row here and reaches all of them:

    TOOLS["inspect"] = ModelTool(build=..., call=lambda parts, context, args: parts.obligations.inspect(...))

``definition(name, view)`` is the one way to a tool's definition: the
canonical one (``name``, ``description``, ``input_schema``: a JSON Schema
object) or None when the session may not see the tool (deny by default).
``call(parts, view, context, name, arguments)`` runs it through the host's
parts (``ToolParts``, built once with them) with the context the host bound
(session, run, tool call): identity never comes from the arguments.
"""

import json
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from treemail.adapters.config import Config
from treemail.domain import peers
from treemail.domain.commands import URGENT_SEND, SendContext
from treemail.domain.errors import Code
from treemail.domain.records import SessionRecord
from treemail.domain.state import SessionState
from treemail.domain.results import error_result
from treemail.services.peers import PeerService

from . import interrupt as interrupt_tool
from . import message as message_tools
from . import peer as peer_tools
from . import receipt as receipt_tool
from . import search as search_tool
from . import send_message as tool
from . import subtree as subtree_tool


def error_text(result: dict) -> str:
    return f"{result['error']['code']}: {result['error']['message']}"


@dataclass(frozen=True)
class SessionView:
    """What a tool's definition depends on: the session's record, its state, the deployment's config, and
    the peer routes (for the peer tools; None: a view without them offers no peer tool's definition)."""

    record: SessionRecord
    state: SessionState
    config: Config
    peers: PeerService | None = None


class Views:
    """The views tool definitions are built from: the session's record and state read once, with the config
    and the peer routes every view of this host shares."""

    def __init__(self, reader, config: Config, peers: PeerService | None) -> None:
        self._reader = reader
        self._config = config
        self._peers = peers

    def of(self, record: SessionRecord, state: SessionState) -> SessionView:
        return SessionView(record, state, self._config, self._peers)

    async def read(self, session_id: str) -> SessionView:
        """``UnknownSessionError`` for a session treemail does not know."""
        record = await self._reader.record(session_id)
        return SessionView(record, await self._reader.state(record), self._config, self._peers)


@dataclass(frozen=True)
class ToolParts:
    """What the rows call: the host's parts that answer each tool (built with them, ``wiring.py``)."""

    sending: Any  # send_message(context, arguments)
    interrupts: Any  # interrupt_agent(context, arguments)
    obligations: message_tools.Inspector
    peers: Any  # send, reply, inbox (context, arguments)
    history: Any  # search_page, read_receipt
    subtree: Any  # message_subtree(context, arguments)
    reader: Any  # the session reader: the caller's tree peers (read_receipt)


@dataclass(frozen=True)
class ModelTool:
    # What the tool is for this session, or None (hidden: no rule, no grant).
    build: Callable[[SessionView], Awaitable[dict | None]]
    call: Callable[[ToolParts, SendContext, Any], Awaitable[dict]]
    # The one-line text a model reads for a successful result (errors read `code: message`).
    text: Callable[[dict], str] = lambda result: json.dumps(result, ensure_ascii=False)
    # The name a host installs it under one by one (``tm.tools.install``), then still subject to its grant;
    # None: the session's rules govern it (always installed).
    installed: str | None = None


def _ruled(build: Callable[[SessionView], dict | None]):
    """A definition that needs no I/O."""
    async def definition(view: SessionView) -> dict | None:
        return build(view)
    return definition


async def _peer_send(view: SessionView) -> dict | None:
    return peer_tools.send_definition(await view.peers.views(view.record)) if view.peers else None


async def _peer_reply(view: SessionView) -> dict | None:
    return peer_tools.reply_definition(await view.peers.views(view.record)) if view.peers else None


def _message_row(name: str, **text) -> "ModelTool":
    return ModelTool(
        build=_ruled(lambda view: message_tools.tool_definition(name)),
        call=lambda parts, context, arguments: message_tools.handle(parts.obligations, name, context, arguments),
        installed=name, **text,
    )


TOOLS: dict[str, ModelTool] = {
    # send_message: always there where the session's rules allow it
    tool.TOOL_NAME: ModelTool(
        build=_ruled(lambda view: tool.tool_definition(
            view.record.rules, view.record.send_message_tool, view.config.messaging.routing,
            view.config.messaging.content_blocks, overlay=view.state.rules_overlay,
            threads=view.config.messaging.threads, mail_control=view.config.messaging.mail_control,
            urgent=URGENT_SEND in view.state.installed_tools,
        )),
        call=lambda parts, context, arguments: parts.sending.send_message(context, arguments),
        # The one wording of a send_message result (``send_message.result_text``), whoever renders it.
        text=tool.result_text,
    ),
    # interrupt_agent: the second control tool, where an `interrupt` rule allows it
    interrupt_tool.TOOL_NAME: ModelTool(
        build=_ruled(lambda view: interrupt_tool.tool_definition(view.record.interrupt_rules)),
        call=lambda parts, context, arguments: parts.interrupts.interrupt_agent(context, arguments),
        text=lambda result: result.get("message") or f"interrupt: {result.get('result')}",
    ),
    # Installed one by one: a sender inspects and retries its own messages ...
    "inspect_message": _message_row("inspect_message"),
    "retry_message": _message_row("retry_message"),
    # ... takes back one a recipient has not received yet (cancel) ...
    "cancel_message": _message_row(
        "cancel_message", text=lambda result: f"message {result['message_id']}: {result['outcome']}"),
    # ... and talks over its peer routes, each tool offered only where a grant allows it.
    "send_to_peer": ModelTool(
        build=_peer_send, installed="send_to_peer",
        call=lambda parts, context, arguments: parts.peers.send(context, arguments),
    ),
    "reply_to_peer": ModelTool(
        build=_peer_reply, installed="reply_to_peer",
        call=lambda parts, context, arguments: parts.peers.reply(context, arguments),
    ),
    "peer_inbox": ModelTool(
        build=_ruled(lambda view: peer_tools.inbox_definition(peers.receives(view.state.peers))),
        installed="peer_inbox",
        call=lambda parts, context, arguments: parts.peers.inbox(context, arguments),
    ),
    # ... and searches the mail it sent and received.
    search_tool.TOOL_NAME: ModelTool(
        build=_ruled(lambda view: search_tool.tool_definition()), installed=search_tool.TOOL_NAME,
        call=lambda parts, context, arguments: search_tool.call(parts.history, context, arguments),
        text=search_tool.result_text,
    ),
    # ... and, installed, sends one message to every agent below it.
    subtree_tool.TOOL_NAME: ModelTool(
        build=_ruled(lambda view: subtree_tool.tool_definition()), installed=subtree_tool.TOOL_NAME,
        call=lambda parts, context, arguments: parts.subtree.message_subtree(context, arguments),
        text=subtree_tool.result_text,
    ),
    # ... and asks how far a recipient has read what it sent.
    receipt_tool.TOOL_NAME: ModelTool(
        build=_ruled(lambda view: receipt_tool.tool_definition()), installed=receipt_tool.TOOL_NAME,
        call=lambda parts, context, arguments: receipt_tool.call(parts.history, parts.reader, context, arguments),
        text=receipt_tool.result_text,
    ),
}


async def definition(name: str, view: SessionView, *, installed: bool = True) -> dict | None:
    """The definition of tool ``name`` for this session; None: no such tool, or the session may not see it.
    ``installed=False``: what the tool would be, whether or not the host installed it."""
    row = TOOLS.get(name)
    if row is None or installed and row.installed is not None and row.installed not in view.state.installed_tools:
        return None
    return await row.build(view)


async def definitions(view: SessionView) -> list[dict]:
    """The definitions of every tool this session may see, in table order."""
    found = [await definition(name, view) for name in TOOLS]
    return [d for d in found if d is not None]


async def call(parts: ToolParts, view: SessionView, context: SendContext, name: str, arguments: Any) -> dict:
    """Run the tool ``name`` for the session in ``context``; a tool it cannot see is unknown, not forbidden."""
    found = await definition(name, view)
    if found is None:
        return error_result(Code.UNKNOWN_TOOL.value, f"no tool named {name!r} is installed for this session")
    return await TOOLS[name].call(parts, context, without_null_optionals(found, arguments))


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
