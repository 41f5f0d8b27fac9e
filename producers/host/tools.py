"""``tm.tools``: every model-facing tool a session has, for any agent framework and for MCP.

The table (``producers/tools/table.py``) says what each tool is; this part
reads the session once, answers a call by name through ``Handlers`` (the
host's parts, bound at wiring) and mints the bearer tokens that bind an MCP
connection to a session; ``tm.tools.mailbox`` is how such a connection
receives when it is the agent itself (``producers/host/mailbox.py``).
"""

import redis.asyncio as aioredis

from treemail.adapters import tokens
from treemail.adapters.config import Config
from treemail.adapters.eventstore import EventStore
from treemail.adapters.tokens import TokenBinding
from treemail.domain import commands as c
from treemail.domain import limits
from treemail.domain.commands import SendContext
from treemail.domain.records import SessionRecord
from treemail.services.sessions import SessionService

from ..tools import schemas, table
from ..tools.table import Handlers, SessionView

from .mailbox import Mailbox


class Tools:
    def __init__(self, redis: aioredis.Redis, config: Config, store: EventStore, sessions: SessionService,
                 mailbox: Mailbox, handlers: Handlers) -> None:
        self._redis = redis
        self._config = config
        self._store = store
        self._sessions = sessions
        self._handlers = handlers
        # What an agent with no engine behind it receives through (an MCP connection that is the agent).
        self.mailbox = mailbox

    async def _view(self, record: SessionRecord) -> SessionView:
        return SessionView(record, (await self._store.load(record)).state, self._config)

    async def definitions(self, session_id: str) -> list[dict]:
        """The canonical definitions of every tool this session may see, in table order (its state read once)."""
        record = await self._sessions.record(session_id)
        return await table.definitions(self._handlers, await self._view(record))

    async def definition(self, session_id: str, name: str) -> dict | None:
        """The definition of ``name`` if the session has that tool; None: an unknown tool."""
        record = await self._sessions.record(session_id)
        found = await table.installed_tool(self._handlers, name, await self._view(record))
        return None if found is None else found[1]

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
        record = await self._sessions.record(session_id)
        return list((await self._store.load(record)).state.installed_tools)

    async def call(self, context: SendContext, name: str, arguments) -> dict:
        """A model's call of any installed tool by name; like send_message, it never raises for model input."""
        record = await self._sessions.record(context.session_id)
        return await table.call(self._handlers, await self._view(record), context, name, arguments)

    async def call_bound(self, binding: TokenBinding, tool_call_id: str, name: str, arguments,
                         view: SessionView | None = None) -> dict | None:
        """``call`` through a binding (``bound_context``), the session read once for the tool and the run;
        None: the session has no tool ``name``. What an MCP request costs before the tool's own work.
        ``view``: the session as read with the token that made this request (``binding_with_view``)."""
        if view is None or view.record.session_id != binding.session_id:
            view = await self._view(await self._sessions.record(binding.session_id))
        found = await table.installed_tool(self._handlers, name, view)
        if found is None:
            return None
        run_id = binding.run_id or view.state.current_run or f"mcp:{binding.binding_id}"
        row, definition = found
        return await row.call(self._handlers, SendContext(binding.session_id, run_id, tool_call_id),
                              table.without_null_optionals(definition, arguments))

    @staticmethod
    def result_text(name: str, result: dict) -> str:
        """What the model reads for the result of tool ``name``: ``code: message`` for an error."""
        return table.result_text(name, result)

    # ---- tokens: an MCP connection bound to a session ---------------------------------------------------

    async def mint_token(self, session_id: str, run_id: str | None = None, ttl_s: int | None = None) -> str:
        """A bearer token binding an MCP connection to this session (and run, else its current one)."""
        limits.require_id("run_id", run_id, optional=True)
        await self._sessions.record(session_id)
        return await tokens.mint(self._redis, session_id, run_id, ttl_s)

    async def revoke_token(self, token: str) -> bool:
        return await tokens.revoke(self._redis, token)

    async def binding(self, token: str) -> TokenBinding | None:
        """The session (and run) a live token binds; None for an unknown, expired or revoked one."""
        return await tokens.lookup(self._redis, token)

    async def binding_with_view(self, token: str, session_id: str | None
                                ) -> tuple[TokenBinding | None, SessionView | None]:
        """``binding``, and the view of ``session_id`` (the session this token bound when last checked) read
        in the same round trip: a call through the token then reads nothing more before its tool's own work.

        A token's binding never changes, only whether it is still live, so a server that remembers whose
        token it is can read that session with the check. The view is None when the token is not live,
        binds another session, or ``session_id`` is unknown (None, or a session that no longer exists).
        """
        where = tokens.key(token)
        if where is None:
            return None, None
        record = await self._store.directory.get(session_id) if session_id is not None else None
        if record is None:
            return tokens.parse(token, await self._redis.get(where)), None

        def build(batch) -> None:
            batch.execute_command("GET", where)
            batch.hmget(self._store.state_key(record), *self._store.STATE_FIELDS)

        raw, state = await self._store.read_round_trip(build)
        binding = tokens.parse(token, raw)
        if binding is None or binding.session_id != record.session_id:
            return binding, None
        return binding, SessionView(record, self._store.parse_loaded(record.session_id, state).state, self._config)

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
            record = await self._sessions.record(binding.session_id)
            run_id = (await self._store.load(record)).state.current_run or f"mcp:{binding.binding_id}"
        return SendContext(binding.session_id, run_id, tool_call_id)
