"""The `ask` rule: a send that waits for a person, and the people's side (list, approve, deny).

A send whose decision is ``approval`` waits here (``ApprovalWait``), durably,
until a person answers, the wait times out or the host closes; ``approve``
and ``deny`` (``tm.permissions``) are one command each through the session
service. The wait's deadline is read on the host's clock, so a test that moves
its clock past ``approval_timeout_s`` ends the wait at its next look.
"""

import time

import redis.asyncio as aioredis
from redis.exceptions import RedisError
from tenacity import AsyncRetrying, RetryError, retry_if_exception_type

from treemail.adapters import approvalindex, keys, tracing
from treemail.adapters.config import ServiceConfig
from treemail.domain import commands as c
from treemail.domain import limits
from treemail.domain.commands import SendArguments, SendContext
from treemail.domain.errors import InvalidRequest, LifecycleError, NotFound
from treemail.services.clock import SYSTEM_CLOCK, Clock
from treemail.services.sessions import SessionService

from ..client import CommandClient
from ..tools import send_message as tool


# How long one look waits for the answer's notification before it reads the request and the clock again.
LOOK_S = 0.5


class ApprovalWait:
    """A send through the command client that, under an `ask` rule, waits for the person's answer."""

    def __init__(self, redis: aioredis.Redis, config: ServiceConfig, commands: CommandClient,
                 clock: Clock = SYSTEM_CLOCK) -> None:
        self._redis = redis
        self._config = config
        self._commands = commands
        self._clock = clock

    async def request(self, context: SendContext, parsed: SendArguments) -> dict:
        # The send's own deadline, from when it was made: however late its first answer comes.
        deadline = self._clock.monotonic() + self._config.approval_timeout_s
        while True:
            outcome = await self._commands.request(context, parsed, tracing.traceparent())
            if "approval" not in outcome:
                break
            # An `ask` rule: the send completes when a person approves, or fails when they deny.
            request_id = outcome["approval"]["request_id"]
            waited = await self._wait(request_id, deadline)
            if waited == "closing":
                return tool.engine_shutdown("the engine is shutting down while the send awaits approval")
            if waited == "timeout":
                return tool.approval_timeout(request_id, self._config.approval_timeout_s)
            # "resolved": decide again, now with the answer; "vanished": a server that lost its last
            # writes lost the request too, and deciding again opens it anew.
        return outcome

    async def _wait(self, request_id: str, deadline: float) -> str:
        """"resolved" once a person answered, "vanished" if the server lost the request, else "timeout" or
        "closing"; never raises. A server blip is retried (the request is durable and the next poll finds
        it) until the host closes or the deadline passes."""
        def over(_state=None) -> bool:
            return self._commands.closing or deadline - self._clock.monotonic() <= 0

        try:
            async for attempt in AsyncRetrying(
                retry=retry_if_exception_type((RedisError, OSError)),
                wait=lambda _: min(0.2, max(deadline - self._clock.monotonic(), 0)), stop=over,
            ):
                with attempt:
                    answered = await self._poll(request_id, deadline)
        except RetryError:
            return "closing" if self._commands.closing else "timeout"
        return answered

    async def _poll(self, request_id: str, deadline: float) -> str:
        while not self._commands.closing:
            left = deadline - self._clock.monotonic()
            if left <= 0:
                return "timeout"
            request = await approvalindex.find(self._redis, request_id, self._config.partitions)
            if request is None:
                return "vanished"  # written in the same step as the answer we got: only data loss removes it
            if request["status"] != "pending":
                return "resolved"
            await self._redis.blpop([keys.approval_notify(request_id)], timeout=min(LOOK_S, max(left, 0.01)))
        return "closing"


async def pending(redis: aioredis.Redis, partitions: int) -> list[dict]:
    requests = await approvalindex.every(redis, partitions)
    return [r for r in requests if r["status"] == "pending"]


async def resolve(redis: aioredis.Redis, sessions: SessionService, partitions: int, request_id: str,
                  decision: str) -> dict:
    limits.require_id("request_id", request_id)  # before any read: a 4 MiB id never reaches the server
    request = await approvalindex.find(redis, request_id, partitions)
    if request is None:
        raise NotFound("approval:unknown_request", f"no approval request has id {request_id}")
    try:
        await sessions.execute(c.ResolveApproval(request["sender_session_id"], request_id, decision))
    except LifecycleError as error:
        raise InvalidRequest(error.code, error.message) from None
    await redis.lpush(keys.approval_notify(request_id), decision)
    await redis.expire(keys.approval_notify(request_id), 3600)
    return {**request, "status": "denied" if decision == "deny" else "approved", "decision": decision,
            "resolved_at": time.time()}
