"""The MCP server: the tools ``producers/tools/table.py`` installs for one bound session, over stdio or HTTP.

Who calls is never an argument. Over stdio the process serves the one session
(and optionally run) it was started for. Over streamable HTTP every request
carries a bearer token the host minted (``tm.tools.mint_token``); the SDK's
bearer middleware checks it in Redis on each request (``adapters/tokens.py``),
so a revoked token is refused at its next request by every server process,
and the handlers read the session and run from the verified token only. The
HTTP transport is stateless: any process can serve any request, because the
binding travels with the request rather than living in one process. With
``--receive`` the session receives too; its claims are held by a lease in the
session's stream, not by a process (``leased.py``).

Each call's context (see ``tm.tools.bound_context``):
- session: the binding's;
- run: the binding's, else the session's current run at the time of the call
  (with none open, a send or an interrupt is refused: ``sender_not_live``);
  for a connection that is the agent (``treemail mcp --receive``), the run the
  connection opened (``connection.py``), which also receives;
- tool call id: ``params._meta["treemail/tool_call_id"]`` when the client
  gives one (an engine passes its model's tool-use id, so a retried tool call
  meets its first outcome: the original message id); otherwise a fresh id,
  so a call is never mistaken for another (and a blind retry sends again).

Results carry the host API's structured result (``structuredContent``) and
the model-facing line (text); a refusal is a tool error (``isError``) whose
structured content is ``{"error": {"code", "message"}}`` and whose text starts
with the stable code. A tool the session does not have is an unknown tool
(JSON-RPC invalid params), as the MCP specification asks.
"""

import asyncio
import contextlib
import importlib.metadata
import json
import signal
import socket
from collections.abc import Awaitable, Callable

from mcp import types
from mcp.server.auth.provider import AccessToken
from mcp.server.auth.settings import AuthSettings
from mcp.server.lowlevel import Server
from mcp.server.subscriptions import InMemorySubscriptionBus, ListenHandler, ResourceUpdated
from mcp.shared.exceptions import MCPError
from mcp_types.jsonrpc import INVALID_PARAMS, INVALID_REQUEST

from treemail.adapters.config import Config
from treemail.adapters.tokens import TokenBinding
from treemail.domain import ids, limits
from treemail.domain.errors import UnknownSessionError

from ..host.facade import Treemail
from ..tools.table import SessionView
from ..tools import receiving
from .checkedhttp import CheckedBodies
from .connection import INBOX_URI, Connection
from .leased import LeasedSession
from .stdio import checked_stdio_server

TOOL_CALL_META = "treemail/tool_call_id"
NAME = "treemail"
INSTRUCTIONS = "Mail to the other agents of your tree. Replies arrive as new messages in your conversation."
# For a connection that is the agent: nothing puts mail into its conversation but its own calls.
RECEIVING_INSTRUCTIONS = (
    "Mail to and from the other agents of your tree. Messages for you arrive when you call check_mail or "
    "wait_for_mail, and urgent ones ride on your other tool results; subscribe to treemail://inbox to be told "
    "when mail arrives."
)

HTTP_RECEIVING_INSTRUCTIONS = (
    "Mail to and from the other agents of your tree. Messages for you arrive when you call check_mail or "
    "wait_for_mail, and urgent ones ride on your other tool results; a subscriptions/listen stream naming "
    "treemail://inbox is told when mail arrives."
)
# A stateless HTTP server has no session to send a handshake-era subscription's notifications to later.
NO_HTTP_NOTIFICATIONS = ("resources/subscribe has no session to notify over stateless HTTP: keep a "
                         "subscriptions/listen stream naming treemail://inbox open, or call wait_for_mail, which "
                         "returns as soon as mail arrives")

Resolve = Callable[[object], Awaitable[TokenBinding]]
# The session as read with the request's token check (HTTP), or None: the call reads it itself.
ViewOf = Callable[[object], "SessionView | None"]
# The connection that is the agent behind a request (None: the tools only, the session run by its engine);
# over HTTP a leased session, rebuilt for each request.
ConnectionOf = Callable[[object], Awaitable["Connection | LeasedSession | None"]]
DELIVERED_META = "treemail/delivered"
# A tool that does nothing past the transport and the token check: what `make bench` puts next to
# send_message on the same server, the transport's own ceiling.
NOOP = {"name": "noop", "description": "Does nothing.", "input_schema": {"type": "object", "properties": {}}}


def tool_call_id(params: types.CallToolRequestParams) -> str:
    """The client's id for this tool call (a retry under it is answered as the first call was), or a fresh one
    when it gave none. One that is not a non-empty string is refused, never replaced: its retry would send
    again."""
    meta = params.meta or {}
    if TOOL_CALL_META not in meta:
        return f"mcp-{ids.uuid7()}"
    return limits.require_id("the tool call id", meta[TOOL_CALL_META])


def images_of(row: dict) -> list[types.ImageContent | types.TextContent]:
    """A message row's images as a client shows them to its model: an image with its data as image content; one
    named by URL (MCP content carries no image by reference) as a line naming its place and its URL."""
    return [types.ImageContent(data=image["data"], mime_type=image["media_type"]) if "data" in image
            else types.TextContent(text=f"[image {image.get('index', '')}]: {image['url']}")
            for image in row.get("images", ())]


def refusal(code: str, message: str) -> types.CallToolResult:
    error = {"error": {"code": code, "message": message}}
    return types.CallToolResult(content=[types.TextContent(text=f"{code}: {message}")], structured_content=error,
                                is_error=True)


@contextlib.asynccontextmanager
async def bound_session():
    """A token (or a stdio server) bound to a session that no longer exists: one clear JSON-RPC error on each
    request, never an internal error with a traceback in the log."""
    try:
        yield
    except UnknownSessionError:
        raise MCPError(INVALID_REQUEST, "the session this connection is bound to no longer exists") from None


def _tool(definition: dict) -> types.Tool:
    return types.Tool(name=definition["name"], description=definition["description"],
                      input_schema=definition["input_schema"])


async def _no_connection(_ctx) -> None:
    return None


def _no_view(_ctx) -> None:
    return None


def build_server(host: Treemail, resolve: Resolve, connection_of: ConnectionOf = _no_connection,
                 noop: bool = False, instructions: str = INSTRUCTIONS, view_of: ViewOf = _no_view) -> Server:
    """A low-level MCP server whose every handler first asks ``resolve`` who is calling.

    With a connection that is the agent (``connection_of``), the server also
    offers the receiving tools and the inbox resource, and each call is a step
    boundary of that connection (``connection.py``).
    """

    async def list_tools(ctx, params) -> types.ListToolsResult:
        binding = await resolve(ctx)
        try:
            definitions = await host.tools.definitions(binding.session_id)
        except UnknownSessionError:
            # A session that no longer exists has no tools, its receiving ones neither. Not an error here: the
            # SDK lists the tools itself before each call (to check its parameters) and logs a listing that fails
            # with a traceback; the call is what answers, with one clear error.
            return types.ListToolsResult(tools=[_tool(NOOP)] if noop else [])
        tools = [_tool(d) for d in definitions]
        if await connection_of(ctx) is not None:
            tools += [_tool(receiving.DEFINITIONS[name]) for name in receiving.NAMES]
        if noop:
            tools.append(_tool(NOOP))
        return types.ListToolsResult(tools=tools)

    async def call_tool(ctx, params: types.CallToolRequestParams) -> types.CallToolResult:
        binding = await resolve(ctx)
        if noop and params.name == NOOP["name"]:
            return types.CallToolResult(content=[types.TextContent(text="")], structured_content={})
        async with bound_session():
            try:
                return await call_bound(ctx, binding, params)
            except limits.IdentifierError as error:
                # The client's tool call id ends up in the recipient's stream: bounded like every identifier.
                return refusal(error.code, f"_meta {TOOL_CALL_META}: {error.message}")

    async def call_bound(ctx, binding: TokenBinding, params: types.CallToolRequestParams) -> types.CallToolResult:
        connection = await connection_of(ctx)
        if connection is not None and params.name in receiving.NAMES:
            result = await connection.receive(params.name, params.arguments or {})
            return types.CallToolResult(
                content=[types.TextContent(text=receiving.result_text(result, connection.threads)),
                         *(block for row in result.get("messages", ()) for block in images_of(row))],
                structured_content=result, is_error="error" in result)
        delivered = []
        call_id = tool_call_id(params)
        if connection is None:
            result = await host.tools.call_bound(binding, call_id, params.name, params.arguments or {},
                                                 view=view_of(ctx))
        else:
            async def call(run_id: str) -> dict | None:
                return await host.tools.call_bound(TokenBinding(binding.session_id, run_id, binding.binding_id),
                                                   call_id, params.name, params.arguments or {})

            result, delivered = await connection.step(call)
        if result is None:
            raise MCPError(INVALID_PARAMS, f"Unknown tool: {limits.shown(params.name, 80)}")
        # Steer mail due at this step rides on the tool's own result, in every form a client may show its
        # model: after the text, and in the structured result (``agent_messages``); the tool's own fields are
        # unchanged. The next call confirms it, so it must be in whichever form that client reads.
        return types.CallToolResult(
            content=[types.TextContent(text=host.tools.result_text(params.name, result)),
                     *(block for d in delivered
                       for block in (types.TextContent(text=d.text), *images_of(receiving.message_row(d))))],
            structured_content=receiving.riding(result, delivered),
            is_error="error" in result,
            meta={DELIVERED_META: [d.message_id for d in delivered]} if delivered else None,
        )

    # ---- the inbox resource (a connection that is the agent) -----------------------------------------

    async def list_resources(ctx, params) -> types.ListResourcesResult:
        resources = []
        if await connection_of(ctx) is not None:
            resources.append(types.Resource(
                uri=INBOX_URI, name="inbox", mime_type="application/json",
                description="The mail waiting for you (senders, no bodies). Subscribe to be told when mail "
                            "arrives; take it with check_mail."))
        return types.ListResourcesResult(resources=resources)

    async def inbox_connection(ctx, uri) -> Connection:
        connection = await connection_of(ctx)
        if connection is None or str(uri) != INBOX_URI:
            raise MCPError(INVALID_PARAMS, f"Unknown resource: {limits.shown(uri, 80)}")
        return connection

    async def read_resource(ctx, params: types.ReadResourceRequestParams) -> types.ReadResourceResult:
        connection = await inbox_connection(ctx, params.uri)
        async with bound_session():
            inbox = await connection.inbox()
        return types.ReadResourceResult(contents=[types.TextResourceContents(
            uri=INBOX_URI, mime_type="application/json", text=json.dumps(inbox))])

    # Handshake-era clients: resources/subscribe, then notifications/resources/updated on the connection.
    subscribed: dict[int, asyncio.Task] = {}

    async def subscribe(ctx, params: types.SubscribeRequestParams) -> types.EmptyResult:
        connection = await inbox_connection(ctx, params.uri)
        if not isinstance(connection, Connection):
            raise MCPError(INVALID_PARAMS, NO_HTTP_NOTIFICATIONS)
        session = ctx.session
        if id(connection) not in subscribed:
            subscribed[id(connection)] = connection.watch(lambda: session.send_resource_updated(INBOX_URI))
        return types.EmptyResult()

    async def unsubscribe(ctx, params: types.UnsubscribeRequestParams) -> types.EmptyResult:
        connection = await inbox_connection(ctx, params.uri)
        task = subscribed.pop(id(connection), None)
        if task is not None:
            task.cancel()
        return types.EmptyResult()

    # 2026-07-28 clients: a subscriptions/listen stream naming the inbox; it is watched while the stream is open.
    bus = InMemorySubscriptionBus()
    listen_handler = ListenHandler(bus)

    async def listen(ctx, params: types.SubscriptionsListenRequestParams):
        connection = await connection_of(ctx)
        handler, watcher = listen_handler, None
        if connection is not None and INBOX_URI in (params.notifications.resource_subscriptions or ()):
            async with bound_session():  # a session gone is one clear error, not a stream never told anything
                await connection.inbox()
            if isinstance(connection, LeasedSession):
                # One HTTP server serves many sessions, all naming their inbox by the same URI: each stream
                # gets a bus of its own, so one session's mail never wakes another's listener.
                own_bus = InMemorySubscriptionBus()
                handler = ListenHandler(own_bus)
                token = _access_of(ctx).token

                async def tell() -> None:
                    # A stream makes no further request to refuse: a token revoked since it opened is told nothing.
                    if (await host.tools.binding_with_view(token, None))[0] is not None:
                        await own_bus.publish(ResourceUpdated(uri=INBOX_URI))

                watcher = connection.watch(tell)
            else:
                watcher = connection.watch(lambda: bus.publish(ResourceUpdated(uri=INBOX_URI)))
        try:
            return await handler(ctx, params)
        finally:
            if watcher is not None:
                watcher.cancel()

    # The package's version, as every MCP server reports its own; the protocol number is in the instructions.
    # No tool of ours declares an `Mcp-Param-*` header, so there is never a header to validate: without this
    # the 2026-07-28 HTTP path ran the whole tools/list handler (the session read, every definition built)
    # before each call that has arguments, a second read of the session per send.
    def no_header_params(_name: str) -> None:
        return None

    return Server(NAME, version=package_version(), instructions=instructions,
                  get_tool_input_schema=no_header_params, on_list_tools=list_tools,
                  on_call_tool=call_tool, on_list_resources=list_resources, on_read_resource=read_resource,
                  on_subscribe_resource=subscribe, on_unsubscribe_resource=unsubscribe,
                  on_subscriptions_listen=listen)


# ---- stdio: one session per process ------------------------------------------------------------


def package_version() -> str:
    try:
        return importlib.metadata.version("treemail")
    except importlib.metadata.PackageNotFoundError:  # run from a source tree never installed
        return "0+unknown"


async def serve_stdio(config: Config, url: str, session_id: str, run_id: str | None = None,
                      receive: bool = False) -> None:
    """Serve the session's tools on stdin/stdout until the client closes them.

    ``receive``: this process is the agent (no engine runs the session): the
    session runs while it is connected and receives mail (``connection.py``).
    """
    limits.require_id("run_id", run_id, optional=True)
    host = await Treemail.connect(config, url)
    connection = None
    try:
        await host.tools.definitions(session_id)  # an unknown session fails here, before any client speaks
        binding = TokenBinding(session_id, run_id, f"stdio-{ids.uuid7()}")
        if receive:
            connection = Connection(host, session_id)
            await connection.open()

        async def resolve(_ctx) -> TokenBinding:
            return binding

        async def connection_of(_ctx) -> Connection | None:
            return connection

        server = build_server(host, resolve, connection_of,
                              instructions=RECEIVING_INSTRUCTIONS if receive else INSTRUCTIONS)
        async with checked_stdio_server() as (read_stream, write_stream):
            await server.run(read_stream, write_stream, server.create_initialization_options())
    finally:
        if connection is not None:
            await connection.close()
        await host.close()


# ---- streamable HTTP: each request bound by its bearer token -------------------------------------


# Tokens whose session this process remembers (a token's binding never changes); past it, it starts afresh.
KNOWN_TOKENS = 10_000
VIEW_CLAIM = "treemail/session_view"


class RedisTokenVerifier:
    """The SDK's TokenVerifier over the tokens the host mints; the principal is the session.

    Every request's token is checked in Redis (a revoked one is refused at its next request). From a
    token's second request on, its session is read in the same round trip as the check, and the call
    uses that read: an MCP send used to read the session in a round trip of its own, after the check.
    """

    def __init__(self, host: Treemail) -> None:
        self.host = host
        self._sessions: dict[str, str] = {}

    async def verify_token(self, token: str) -> AccessToken | None:
        binding, view = await self.host.tools.binding_with_view(token, self._sessions.get(token))
        if binding is None:
            self._sessions.pop(token, None)
            return None
        if len(self._sessions) >= KNOWN_TOKENS:
            self._sessions.clear()
        self._sessions[token] = binding.session_id
        return AccessToken(
            token=token, client_id=binding.session_id, scopes=[], subject=binding.session_id,
            claims={"run_id": binding.run_id, "binding_id": binding.binding_id, VIEW_CLAIM: view},
        )


def _access_of(ctx) -> AccessToken:
    user = ctx.request.scope.get("user") if ctx.request is not None else None
    access = getattr(user, "access_token", None)
    if access is None:  # the bearer middleware lets no such request through; never serve one unbound
        raise MCPError(INVALID_PARAMS, "this request carries no verified treemail token")
    return access


def _binding_of(ctx) -> TokenBinding:
    access = _access_of(ctx)
    return TokenBinding(access.client_id, access.claims["run_id"], access.claims["binding_id"])


def _view_of(ctx) -> SessionView | None:
    user = ctx.request.scope.get("user") if ctx.request is not None else None
    access = getattr(user, "access_token", None)
    return access.claims.get(VIEW_CLAIM) if access is not None and access.claims else None


def http_app(host: Treemail, bind_host: str = "127.0.0.1", port: int = 8765, noop: bool = False,
             receive: bool = False):
    """The Starlette app serving ``/mcp``; every request needs ``Authorization: Bearer <token>``.
    ``noop``: also a tool that does nothing (the benchmark's transport ceiling); ``receive``: each token's
    session is an agent that receives, its claims held by a lease (``leased.py``), not by this process."""

    async def resolve(ctx) -> TokenBinding:
        return _binding_of(ctx)

    async def leased_session(ctx) -> LeasedSession:
        return LeasedSession(host, _binding_of(ctx).session_id)

    server = build_server(host, resolve, leased_session if receive else _no_connection, noop=noop,
                          instructions=HTTP_RECEIVING_INSTRUCTIONS if receive else INSTRUCTIONS, view_of=_view_of)
    app = server.streamable_http_app(
        # A receiving agent's listen stream carries its inbox notifications as server-sent events; a JSON
        # response could carry only the final result.
        stateless_http=True, json_response=not receive, host=bind_host,
        # No OAuth server here: the host mints tokens; issuer_url is required by the settings model only.
        auth=AuthSettings(issuer_url=f"http://{_url_host(bind_host)}:{port}", resource_server_url=None),
        token_verifier=RedisTokenVerifier(host),
    )
    # Every body judged as a stdio line is, behind the bearer check: one JSON-RPC error rule for both transports.
    for route in app.routes:
        if getattr(route, "path", None) == "/mcp":
            route.app.app = CheckedBodies(route.app.app)
    return app


def _url_host(host: str) -> str:
    """``host`` as a URL names it: an IPv6 address in brackets."""
    return f"[{host.strip('[]')}]" if ":" in host else host


async def serve_http(config: Config, url: str, listening: socket.socket, say=None, receive: bool = False) -> None:
    """Serve streamable HTTP on ``/mcp`` of the socket ``listening`` (bound by the caller, so a taken port is
    its one line, not a server task's traceback) until SIGINT or SIGTERM.

    ``say`` is told the address once the server answers, so whoever started it knows where to point a
    client."""
    import uvicorn

    host, port = listening.getsockname()[:2]
    api = await Treemail.connect(config, url)
    try:
        server = uvicorn.Server(uvicorn.Config(http_app(api, host, port, receive=receive), log_level="warning"))
        task = asyncio.create_task(server.serve(sockets=[listening]))
        while not server.started and not task.done():
            await asyncio.sleep(0.02)
        if server.started and say is not None:
            say(f"MCP over streamable HTTP on http://{_url_host(host)}:{port}/mcp; each request needs "
                "Authorization: Bearer <a token from `treemail mcp-token SESSION`>")
        stopping = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stopping.set)
        await asyncio.wait([task, asyncio.create_task(stopping.wait())], return_when=asyncio.FIRST_COMPLETED)
        server.should_exit = True
        with contextlib.suppress(asyncio.CancelledError):
            await task
    finally:
        await api.close()
