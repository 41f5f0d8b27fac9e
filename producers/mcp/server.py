"""The MCP server: the tools ``producers/tools/table.py`` installs for one bound session, over stdio or HTTP.

Who calls is never an argument. Over stdio the process serves the one session
(and optionally run) it was started for. Over streamable HTTP every request
carries a bearer token the host minted (``tm.tools.mint_token``); the SDK's
bearer middleware checks it in Redis on each request (``adapters/tokens.py``),
so a revoked token is refused at its next request by every server process,
and the handlers read the session and run from the verified token only. The
HTTP transport is stateless: any process can serve any request, because the
binding travels with the request rather than living in one process.

Each call's context (see ``tm.tools.bound_context``):
- session: the binding's;
- run: the binding's, else the session's current run at the time of the call
  (with none open, a send or an interrupt is refused: ``sender_not_live``);
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
import signal
from collections.abc import Awaitable, Callable

from mcp import types
from mcp.server.auth.provider import AccessToken
from mcp.server.auth.settings import AuthSettings
from mcp.server.lowlevel import Server
from mcp.server.stdio import stdio_server
from mcp.shared.exceptions import MCPError
from mcp_types.jsonrpc import INVALID_PARAMS, INVALID_REQUEST

from treemail.adapters.config import Config
from treemail.adapters.tokens import TokenBinding
from treemail.domain import ids, limits
from treemail.domain.errors import UnknownSessionError

from ..host.facade import Treemail

TOOL_CALL_META = "treemail/tool_call_id"
NAME = "treemail"
INSTRUCTIONS = "Mail to the other agents of your tree. Replies arrive as new messages in your conversation."

Resolve = Callable[[object], Awaitable[TokenBinding]]


def tool_call_id(params: types.CallToolRequestParams) -> str:
    given = (params.meta or {}).get(TOOL_CALL_META)
    return given if isinstance(given, str) and given else f"mcp-{ids.uuid7()}"


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


def build_server(host: Treemail, resolve: Resolve) -> Server:
    """A low-level MCP server whose every handler first asks ``resolve`` who is calling."""

    async def list_tools(ctx, params) -> types.ListToolsResult:
        binding = await resolve(ctx)
        try:
            definitions = await host.tools.definitions(binding.session_id)
        except UnknownSessionError:
            # A session that no longer exists has no tools. Not an error here: the SDK lists the tools itself
            # before each call (to check its parameters) and logs a listing that fails with a traceback; the
            # call is what answers, with one clear error.
            definitions = []
        return types.ListToolsResult(tools=[
            types.Tool(name=d["name"], description=d["description"], input_schema=d["input_schema"])
            for d in definitions
        ])

    async def call_tool(ctx, params: types.CallToolRequestParams) -> types.CallToolResult:
        binding = await resolve(ctx)
        async with bound_session():
            return await call_bound(binding, params)

    async def call_bound(binding: TokenBinding, params: types.CallToolRequestParams) -> types.CallToolResult:
        if await host.tools.definition(binding.session_id, params.name) is None:
            raise MCPError(INVALID_PARAMS, f"Unknown tool: {params.name}")
        try:
            # The client's tool call id ends up in the recipient's stream: bounded like every identifier.
            context = await host.tools.bound_context(binding, tool_call_id(params))
        except limits.IdentifierError as error:
            return refusal(error.code, f"_meta {TOOL_CALL_META}: {error.message}")
        result = await host.tools.call(context, params.name, params.arguments or {})
        return types.CallToolResult(
            content=[types.TextContent(text=host.tools.result_text(params.name, result))],
            structured_content=result,
            is_error="error" in result,
        )

    # The package's version, as every MCP server reports its own; the protocol number is in the instructions.
    return Server(NAME, version=package_version(), instructions=INSTRUCTIONS, on_list_tools=list_tools,
                  on_call_tool=call_tool)


# ---- stdio: one session per process ------------------------------------------------------------


def package_version() -> str:
    try:
        return importlib.metadata.version("treemail")
    except importlib.metadata.PackageNotFoundError:  # run from a source tree never installed
        return "0+unknown"


async def serve_stdio(config: Config, url: str, session_id: str, run_id: str | None = None) -> None:
    """Serve the session's tools on stdin/stdout until the client closes them."""
    limits.require_id("run_id", run_id, optional=True)
    host = await Treemail.connect(config, url)
    try:
        await host.tools.definitions(session_id)  # an unknown session fails here, before any client speaks
        binding = TokenBinding(session_id, run_id, f"stdio-{ids.uuid7()}")

        async def resolve(_ctx) -> TokenBinding:
            return binding

        server = build_server(host, resolve)
        async with stdio_server() as (read_stream, write_stream):
            await server.run(read_stream, write_stream, server.create_initialization_options())
    finally:
        await host.close()


# ---- streamable HTTP: each request bound by its bearer token -------------------------------------


class RedisTokenVerifier:
    """The SDK's TokenVerifier over the tokens the host mints; the principal is the session."""

    def __init__(self, host: Treemail) -> None:
        self.host = host

    async def verify_token(self, token: str) -> AccessToken | None:
        binding = await self.host.tools.binding(token)
        if binding is None:
            return None
        return AccessToken(
            token=token, client_id=binding.session_id, scopes=[], subject=binding.session_id,
            claims={"run_id": binding.run_id, "binding_id": binding.binding_id},
        )


def _binding_of(ctx) -> TokenBinding:
    user = ctx.request.scope.get("user") if ctx.request is not None else None
    access = getattr(user, "access_token", None)
    if access is None:  # the bearer middleware lets no such request through; never serve one unbound
        raise MCPError(INVALID_PARAMS, "this request carries no verified treemail token")
    return TokenBinding(access.client_id, access.claims["run_id"], access.claims["binding_id"])


def http_app(host: Treemail, bind_host: str = "127.0.0.1", port: int = 8765):
    """The Starlette app serving ``/mcp``; every request needs ``Authorization: Bearer <token>``."""

    async def resolve(ctx) -> TokenBinding:
        return _binding_of(ctx)

    server = build_server(host, resolve)
    return server.streamable_http_app(
        stateless_http=True, json_response=True, host=bind_host,
        # No OAuth server here: the host mints tokens; issuer_url is required by the settings model only.
        auth=AuthSettings(issuer_url=f"http://{bind_host}:{port}", resource_server_url=None),
        token_verifier=RedisTokenVerifier(host),
    )


async def serve_http(config: Config, url: str, host: str = "127.0.0.1", port: int = 8765, say=None) -> None:
    """Serve streamable HTTP on ``http://host:port/mcp`` until SIGINT or SIGTERM.

    ``say`` is told the address once the port is bound (port 0: the one the system chose), so whoever
    started it knows where to point a client."""
    import uvicorn

    api = await Treemail.connect(config, url)
    try:
        server = uvicorn.Server(uvicorn.Config(http_app(api, host, port), host=host, port=port, log_level="warning"))
        task = asyncio.create_task(server.serve())
        while not server.started and not task.done():
            await asyncio.sleep(0.02)
        if server.started and say is not None:
            bound = server.servers[0].sockets[0].getsockname()[1]
            say(f"MCP over streamable HTTP on http://{host}:{bound}/mcp; each request needs "
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
