"""Bearer tokens that bind an MCP connection to one agent session (and optionally one run).

The host mints a token for a session and hands it to whatever runs the agent;
every MCP server process checks it in Redis on each request, so revoking it
stops the next request everywhere. Only the SHA-256 digest of a token is
stored: a token carries 256 random bits, so a salted or slow hash would add
nothing, and a read of the database never yields a usable token.
"""

import hashlib
import json
import secrets
import time
from dataclasses import dataclass

from redis.asyncio import Redis

from . import keys

TOKEN_PREFIX = "tmk_"


@dataclass(frozen=True)
class TokenBinding:
    session_id: str
    # None: each call uses the session's current run (see producers/tools/table.py, ``bound_context``).
    run_id: str | None
    # A stable, non-secret name for the binding (a prefix of the digest): the run of last resort.
    binding_id: str


def digest(token: str) -> str:
    return hashlib.sha256(token.encode("utf-8", "surrogatepass")).hexdigest()


async def mint(redis: Redis, session_id: str, run_id: str | None = None, ttl_s: int | None = None) -> str:
    token = TOKEN_PREFIX + secrets.token_urlsafe(32)
    record = json.dumps({"session_id": session_id, "run_id": run_id, "minted_at": time.time()})
    await redis.set(keys.access_token(digest(token)), record, ex=ttl_s)
    return token


def key(token: str) -> str | None:
    """Where the token's binding is kept; None for a string that is no token of ours (never looked up)."""
    return keys.access_token(digest(token)) if token.startswith(TOKEN_PREFIX) else None


def parse(token: str, raw: bytes | None) -> TokenBinding | None:
    """The binding read from ``key(token)``; None for a token that is unknown, expired or revoked."""
    if raw is None:
        return None
    data = json.loads(raw)
    return TokenBinding(data["session_id"], data.get("run_id"), digest(token)[:16])


async def lookup(redis: Redis, token: str) -> TokenBinding | None:
    where = key(token)
    return None if where is None else parse(token, await redis.get(where))


async def revoke(redis: Redis, token: str) -> bool:
    """True if the token existed; from now on every server refuses it."""
    return bool(await redis.delete(keys.access_token(digest(token))))
