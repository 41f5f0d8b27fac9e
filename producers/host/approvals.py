"""The `ask` rule in the host API: a send that waits for a person, and the people's side (list, approve, deny).

A part of ``Treemail`` (like ``DisposalHost`` and ``PeerHost``): a send whose
decision is ``approval`` waits here, durably, until a person answers, the
wait times out or the host closes; ``approve`` and ``deny`` are one command
each through the session service.
"""

import asyncio
import time

from redis.exceptions import RedisError

from treemail.adapters import approvalindex, keys, tracing
from treemail.domain import commands as c
from treemail.domain.commands import SendContext
from treemail.domain.errors import LifecycleError

from treemail.producers.tools import send_message as tool


class ApprovalHost:
    async def _request(self, context: SendContext, parsed) -> dict:
        deadline = None
        while True:
            outcome = await self.commands.request(context, parsed, tracing.traceparent())
            if "approval" not in outcome:
                break
            # An `ask` rule: the send completes when a person approves, or fails when they deny.
            request_id = outcome["approval"]["request_id"]
            deadline = deadline or time.monotonic() + self.config.service.approval_timeout_s
            waited = await self._wait_for_approval(request_id, deadline)
            if waited == "closing":
                return tool.engine_shutdown("the engine is shutting down while the send awaits approval")
            if waited == "timeout":
                return tool.approval_timeout(request_id, self.config.service.approval_timeout_s)
            # "resolved": decide again, now with the answer; "vanished": a server that lost its last
            # writes lost the request too, and deciding again opens it anew.
        return outcome

    async def _wait_for_approval(self, request_id: str, deadline: float) -> str:
        """"resolved" once a person answered, "vanished" if the server lost the request, else "timeout" or
        "closing"; never raises."""
        while not self.commands.closing:
            left = deadline - time.monotonic()
            if left <= 0:
                return "timeout"
            try:
                request = await approvalindex.find(self.redis, request_id, self.config.service.partitions)
                if request is None:
                    return "vanished"  # written in the same step as the answer we got: only data loss removes it
                if request["status"] != "pending":
                    return "resolved"
                await self.redis.blpop([keys.approval_notify(request_id)], timeout=min(1.0, max(left, 0.01)))
            except (RedisError, OSError):
                # A server blip: keep waiting; the request is durable and the next poll finds it.
                await asyncio.sleep(min(0.2, max(left, 0)))
        return "closing"

    async def pending_approvals(self) -> list[dict]:
        requests = await approvalindex.every(self.redis, self.config.service.partitions)
        return [r for r in requests if r["status"] == "pending"]

    async def approve(self, request_id: str, scope: str = "once") -> dict:
        if scope not in ("once", "tree"):
            raise ValueError(f"scope must be once or tree, got {scope!r}")
        return await self._resolve(request_id, "approve_tree" if scope == "tree" else "approve_once")

    async def deny(self, request_id: str) -> dict:
        return await self._resolve(request_id, "deny")

    async def _resolve(self, request_id: str, decision: str) -> dict:
        request = await approvalindex.find(self.redis, request_id, self.config.service.partitions)
        if request is None:
            raise LookupError(f"no approval request has id {request_id}")
        try:
            await self.sessions.execute(c.ResolveApproval(request["sender_session_id"], request_id, decision))
        except LifecycleError as error:
            raise ValueError(error.message) from None
        await self.redis.lpush(keys.approval_notify(request_id), decision)
        await self.redis.expire(keys.approval_notify(request_id), 3600)
        return {**request, "status": "denied" if decision == "deny" else "approved", "decision": decision,
                "resolved_at": time.time()}
