"""Where a sender's peer names lead: source -> (name -> target session), a lookup beside the streams.

The route itself lives on the target's stream, and a send is decided on
that; this index only says which target to load. It is written before the
route's event and cleaned after its revocation, so at worst it points at a
target that holds no such route, which refuses the send: deny by default
holds whatever state the index is in.
"""

from redis.asyncio import Redis

from ..domain.records import SessionRecord
from . import keys

# Delete a name only if it still leads to the target being revoked (a newer registration may have moved it).
_REMOVE_IF = """
if redis.call('HGET', KEYS[1], ARGV[1]) == ARGV[2] then return redis.call('HDEL', KEYS[1], ARGV[1]) end
return 0
"""


def _text(value) -> str | None:
    return value.decode() if isinstance(value, bytes) else value


class PeerIndex:
    def __init__(self, redis: Redis) -> None:
        self.redis = redis

    async def get(self, source_kind: str, source: str, name: str) -> str | None:
        return _text(await self.redis.hget(keys.peer_routes(source_kind, source), name))

    async def put(self, source_kind: str, source: str, name: str, target_session_id: str) -> None:
        await self.redis.hset(keys.peer_routes(source_kind, source), name, target_session_id)

    async def remove_if(self, source_kind: str, source: str, name: str, target_session_id: str) -> None:
        await self.redis.eval(_REMOVE_IF, 1, keys.peer_routes(source_kind, source), name, target_session_id)

    async def routes_of(self, sender: SessionRecord) -> dict[str, str]:
        """name -> target session for this sender: its own routes over its agent type's."""
        async with self.redis.pipeline(transaction=False) as pipe:
            pipe.hgetall(keys.peer_routes("agent_type", sender.agent_type))
            pipe.hgetall(keys.peer_routes("session", sender.session_id))
            by_type, by_session = await pipe.execute()
        found = {_text(k): _text(v) for k, v in by_type.items()}
        found.update({_text(k): _text(v) for k, v in by_session.items()})
        return found

    async def resolve(self, sender: SessionRecord, name: str) -> str | None:
        async with self.redis.pipeline(transaction=False) as pipe:
            pipe.hget(keys.peer_routes("session", sender.session_id), name)
            pipe.hget(keys.peer_routes("agent_type", sender.agent_type), name)
            own, by_type = await pipe.execute()
        return _text(own or by_type)
