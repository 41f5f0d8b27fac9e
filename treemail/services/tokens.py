"""Bearer tokens binding an MCP connection to a session: minted, revoked, looked up (``adapters.tokens``).

``binding_with_state`` reads a live token and the state of the session it
bound when last checked in one round trip: a call through the token then reads
nothing more before its tool's own work.
"""

from ..adapters import tokens
from ..adapters.tokens import TokenBinding
from ..domain.records import SessionRecord
from ..domain.state import SessionState
from .sessionreader import SessionReader


class TokenService:
    def __init__(self, redis, reader: SessionReader) -> None:
        self._redis = redis
        self._reader = reader

    async def mint(self, session_id: str, run_id: str | None = None, ttl_s: int | None = None) -> str:
        return await tokens.mint(self._redis, session_id, run_id, ttl_s)

    async def revoke(self, token: str) -> bool:
        return await tokens.revoke(self._redis, token)

    async def lookup(self, token: str) -> TokenBinding | None:
        return await tokens.lookup(self._redis, token)

    async def binding_with_state(self, token: str, session_id: str | None
                                 ) -> tuple[TokenBinding | None, SessionRecord | None, SessionState | None]:
        """The token's binding, and the record and state of ``session_id`` where the token binds it (else
        None, None): one round trip when the session is known."""
        where = tokens.key(token)
        if where is None:
            return None, None, None
        record = await self._reader.find(session_id) if session_id is not None else None
        if record is None:
            return tokens.parse(token, await self._redis.get(where)), None, None

        def build(batch) -> None:
            batch.execute_command("GET", where)
            self._reader.state_read(record, batch)

        raw, state = await self._reader.read_round_trip(build)
        binding = tokens.parse(token, raw)
        if binding is None or binding.session_id != record.session_id:
            return binding, None, None
        return binding, record, self._reader.parse_state(record, state)
