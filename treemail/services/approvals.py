"""The `ask` rule: a send that waits for a person, and the people's side (list, approve, deny).

A send whose decision is ``approval`` waits here (``ApprovalWait``), durably,
until a person answers, the wait times out or the host closes; ``resolve``
is one command on the sender's session, then a notification the waiting send
is woken by. A request is kept in its partition's approvals index by the
commit step that records it (``adapters.approvalindex``). The wait's deadline
is read on the host's clock, so a test that moves its clock past
``approval_timeout_s`` ends the wait at its next look.
"""

import time

from redis.exceptions import RedisError
from tenacity import AsyncRetrying, RetryError, retry_if_exception_type

from ..adapters import approvalindex, keys, tracing
from ..adapters.commandclient import CommandClient
from ..adapters.config import ServiceConfig
from ..domain import commands as c
from ..domain import limits
from ..domain.commands import SendArguments, SendContext
from ..domain.errors import InvalidRequest, LifecycleError, NotFound
from ..domain.results import approval_timeout, engine_shutdown
from .clock import SYSTEM_CLOCK, Clock
from .sessions import SessionService

# How long one look waits for the answer's notification before it reads the request and the clock again.
LOOK_S = 0.5
# How long an answer's notification is kept for a send that looks for it late.
NOTIFY_TTL_S = 3600


class ApprovalService:
    """The people's side: the requests pending, and a person's answer to one."""

    def __init__(self, redis, sessions: SessionService, partitions: int) -> None:
        self._redis = redis
        self._sessions = sessions
        self._partitions = partitions

    async def find(self, request_id: str) -> dict | None:
        return await approvalindex.find(self._redis, request_id, self._partitions)

    async def pending(self) -> list[dict]:
        requests = await approvalindex.every(self._redis, self._partitions)
        return [r for r in requests if r["status"] == "pending"]

    async def resolve(self, request_id: str, decision: str) -> dict:
        limits.require_id("request_id", request_id)  # before any read: a 4 MiB id never reaches the server
        request = await self.find(request_id)
        if request is None:
            raise NotFound("approval:unknown_request", f"no approval request has id {request_id}")
        try:
            await self._sessions.execute(c.ResolveApproval(request["sender_session_id"], request_id, decision))
        except LifecycleError as error:
            raise InvalidRequest(error.code, error.message) from None
        await self._redis.lpush(keys.approval_notify(request_id), decision)
        await self._redis.expire(keys.approval_notify(request_id), NOTIFY_TTL_S)
        return {**request, "status": "denied" if decision == "deny" else "approved", "decision": decision,
                "resolved_at": time.time()}

    async def wait_answered(self, request_id: str, timeout_s: float) -> None:
        """Until the request's answer is notified, or ``timeout_s`` passes."""
        await self._redis.blpop([keys.approval_notify(request_id)], timeout=timeout_s)


class ApprovalWait:
    """A send through the command client that, under an `ask` rule, waits for the person's answer."""

    def __init__(self, approvals: ApprovalService, config: ServiceConfig, commands: CommandClient,
                 clock: Clock = SYSTEM_CLOCK) -> None:
        self._approvals = approvals
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
                return engine_shutdown("the engine is shutting down while the send awaits approval")
            if waited == "timeout":
                return approval_timeout(request_id, self._config.approval_timeout_s)
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
            request = await self._approvals.find(request_id)
            if request is None:
                return "vanished"  # written in the same step as the answer we got: only data loss removes it
            if request["status"] != "pending":
                return "resolved"
            await self._approvals.wait_answered(request_id, min(LOOK_S, max(left, 0.01)))
        return "closing"
