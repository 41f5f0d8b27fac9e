"""``tm.tools``: every model-facing tool a session has, for any agent framework and for MCP.

The table (``producers/tools/table.py``) says what each tool is; this part
reads the session once, answers a call by name through ``ToolParts`` (the
host's parts, built with them) and mints the bearer tokens that bind an MCP
connection to a session; ``tm.tools.mailbox`` is how such a connection
receives when it is the agent itself (``producers/host/mailbox.py``).
"""

from treemail.adapters.tokens import TokenBinding
from treemail.domain import commands as c
from treemail.domain import limits
from treemail.domain.commands import SendContext
from treemail.services.tokens import TokenService

from ..tools import schemas, table
from ..tools.table import SessionView, ToolParts

from .mailbox import Mailbox
from .hostcall import require_context
from .shared import Part, Shared


# A token's lifetime is at most ten years: past that the server's expiry (in milliseconds) would overflow.
MAX_TOKEN_TTL_S = 10 * 365 * 86400


class Tools(Part):
    def __init__(self, shared: Shared, tokens: TokenService, mailbox: Mailbox, parts: ToolParts) -> None:
        super().__init__(shared)
        self._tokens = tokens
        self._parts = parts
        # What an agent with no engine behind it receives through (an MCP connection that is the agent).
        self.mailbox = mailbox

    async def definitions(self, session_id: str) -> list[dict]:
        """The canonical definitions of every tool this session may see, in table order (its state read once)."""
        return await table.definitions(await self._views.read(session_id))

    async def definition(self, session_id: str, name: str) -> dict | None:
        """The definition of ``name`` if the session has that tool; None: an unknown tool."""
        return await table.definition(name, await self._views.read(session_id))

    async def schemas(self, session_id: str, format: str = "anthropic") -> list[dict]:
        """The session's tools as ``anthropic``, ``openai`` (function tools, strict where possible) or ``mcp``."""
        return schemas.export(await self.definitions(session_id), format)

    async def install(self, session_id: str, names) -> list[str]:
        """Offer exactly these optional tools to the session's model (one by one: inspect_message,
        retry_message, send_to_peer, reply_to_peer, peer_inbox, search_mail, message_subtree); the peer tools
        still need their grant. An event on the session's stream (``ToolsInstalled``). Returns what is installed now."""
        if isinstance(names, str):
            raise limits.invalid("names must be a list of tool names, not one string")
        await self._sessions.execute(c.InstallTools(session_id, tuple(names)))
        return list((await self._reader.state_of(session_id)).installed_tools)

    async def call(self, context: SendContext, name: str, arguments) -> dict:
        """A model's call of any installed tool by name; like send_message, it never raises for model input."""
        require_context(context)
        return await table.call(self._parts, await self._views.read(context.session_id), context, name, arguments)

    async def call_bound(self, binding: TokenBinding, tool_call_id: str, name: str, arguments,
                         view: SessionView | None = None) -> dict | None:
        """``call`` through a binding (``bound_context``), the session read once for the tool and the run;
        None: the session has no tool ``name``. What an MCP request costs before the tool's own work.
        ``view``: the session as read with the token that made this request (``binding_with_view``)."""
        if view is None or view.record.session_id != binding.session_id:
            view = await self._views.read(binding.session_id)
        definition = await table.definition(name, view)
        if definition is None:
            return None
        run_id = binding.run_id or view.state.current_run or f"mcp:{binding.binding_id}"
        return await table.TOOLS[name].call(self._parts, SendContext(binding.session_id, run_id, tool_call_id),
                                            table.without_null_optionals(definition, arguments))

    @staticmethod
    def result_text(name: str, result: dict) -> str:
        """What the model reads for the result of tool ``name``: ``code: message`` for an error."""
        return table.result_text(name, result)

    # ---- tokens: an MCP connection bound to a session ---------------------------------------------------

    async def mint_token(self, session_id: str, run_id: str | None = None, ttl_s: int | None = None) -> str:
        """A bearer token binding an MCP connection to this session (and run, else its current one). ``ttl_s``:
        whole seconds until it expires, 1 to ten years (None: never)."""
        limits.require_id("run_id", run_id, optional=True)
        if ttl_s is not None and (isinstance(ttl_s, bool) or not isinstance(ttl_s, int)
                                  or not 1 <= ttl_s <= MAX_TOKEN_TTL_S):
            raise limits.invalid(f"ttl_s must be whole seconds from 1 to {MAX_TOKEN_TTL_S}, got {limits.shown(ttl_s)}")
        await self._reader.record(session_id)
        return await self._tokens.mint(session_id, run_id, ttl_s)

    async def revoke_token(self, token: str) -> bool:
        return await self._tokens.revoke(token)

    async def binding(self, token: str) -> TokenBinding | None:
        """The session (and run) a live token binds; None for an unknown, expired or revoked one."""
        return await self._tokens.lookup(token)

    async def binding_with_view(self, token: str, session_id: str | None
                                ) -> tuple[TokenBinding | None, SessionView | None]:
        """``binding``, and the view of ``session_id`` (the session this token bound when last checked) read
        in the same round trip: a call through the token then reads nothing more before its tool's own work.

        A token's binding never changes, only whether it is still live, so a server that remembers whose
        token it is can read that session with the check. The view is None when the token is not live,
        binds another session, or ``session_id`` is unknown (None, or a session that no longer exists).
        """
        binding, record, state = await self._tokens.binding_with_state(token, session_id)
        return binding, None if record is None else self._views.of(record, state)

    async def bound_context(self, binding: TokenBinding, tool_call_id: str) -> SendContext:
        """The context of one call made through a binding (an MCP token, or the session a stdio server serves).

        The run is the binding's when it names one; otherwise the session's
        current run at the time of the call. With no run open, a run named after
        the binding, which is never live: a send or an interrupt through it is
        refused (``sender_not_live``: only a session's open run may send), and
        tools that need no run (inbox, inspect) work as before.
        """
        run_id = binding.run_id
        if run_id is None:
            run_id = (await self._reader.state_of(binding.session_id)).current_run or f"mcp:{binding.binding_id}"
        return SendContext(binding.session_id, run_id, tool_call_id)
