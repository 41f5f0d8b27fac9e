"""Durable approval requests for sends whose permission rule says ``ask``.

A request is keyed by the send's idempotency key: the waiting producer (or a
host that retries the same tool call after a restart) finds the same request,
and once a person approved it the next decision of that send goes through.
Approving "for the session tree" records a grant for the relationship label
in that tree, so later ``ask`` sends of that label in the tree pass too.
"""

import json
import time

from treemail import ids, keys
from treemail.mail import decider as d
from treemail.mail.commands import SendMessage

from .eventstore import EventStore

DECISIONS = ("approve_once", "approve_tree", "deny")


class UnknownApproval(LookupError):
    pass


class ApprovalStore:
    def __init__(self, store: EventStore) -> None:
        self.redis = store.redis

    async def status_for(self, sender: d.SessionRecord, digest: str, label: str) -> d.Approval:
        p = sender.partition
        async with self.redis.pipeline(transaction=False) as pipe:
            pipe.get(keys.approval_by_key(p, digest))
            pipe.sismember(keys.tree_grants(p, sender.root_session_id), label)
            request_id, granted = await pipe.execute()
        status = None
        if request_id is not None:
            raw = await self.redis.get(keys.approval(p, request_id.decode()))
            status = json.loads(raw)["status"] if raw else None
        return d.Approval(status=status, tree_granted=bool(granted))

    async def request(
        self, command: SendMessage, sender: d.SessionRecord, recipient: d.SessionRecord, label: str, digest: str
    ) -> dict:
        """Open the request for this send (or find the open one) and tell the producer to wait for it."""
        p = sender.partition
        candidate = ids.uuid7()
        created = await self.redis.set(keys.approval_by_key(p, digest), candidate, nx=True)
        if created:
            request = {
                "request_id": candidate,
                "status": "pending",
                "partition": p,
                "root_session_id": sender.root_session_id,
                "sender_session_id": sender.session_id,
                "sender_handle": sender.handle,
                "recipient_session_id": recipient.session_id,
                "recipient_handle": recipient.handle,
                "label": label,
                "body": command.arguments.body,
                "mode": command.arguments.mode,
                "created_at": time.time(),
            }
            await self.redis.set(keys.approval(p, candidate), json.dumps(request))
            await self.redis.set(keys.approval_partition(candidate), p)
            await self.redis.zadd(keys.approvals_pending(), {candidate: request["created_at"]})
            request_id = candidate
        else:
            request_id = (await self.redis.get(keys.approval_by_key(p, digest))).decode()
        return {"approval": {"request_id": request_id, "label": label}}

    async def get(self, request_id: str) -> dict:
        partition = await self.redis.get(keys.approval_partition(request_id))
        raw = await self.redis.get(keys.approval(int(partition), request_id)) if partition is not None else None
        if raw is None:
            raise UnknownApproval(f"no approval request has id {request_id}")
        return json.loads(raw)

    async def pending(self) -> list[dict]:
        request_ids = [r.decode() for r in await self.redis.zrange(keys.approvals_pending(), 0, -1)]
        out = []
        for request_id in request_ids:
            request = await self.get(request_id)
            if request["status"] == "pending":
                out.append(request)
        return out

    async def resolve(self, request_id: str, decision: str) -> dict:
        if decision not in DECISIONS:
            raise ValueError(f"decision must be one of {DECISIONS}, got {decision!r}")
        request = await self.get(request_id)
        if request["status"] != "pending":
            raise ValueError(f"approval request {request_id} is already {request['status']}")
        p = request["partition"]
        request["status"] = "denied" if decision == "deny" else "approved"
        request["decision"] = decision
        if decision == "approve_tree":
            await self.redis.sadd(keys.tree_grants(p, request["root_session_id"]), request["label"])
        await self.redis.set(keys.approval(p, request_id), json.dumps(request))
        await self.redis.zrem(keys.approvals_pending(), request_id)
        await self.redis.lpush(keys.approval_notify(request_id), request["status"])
        await self.redis.expire(keys.approval_notify(request_id), 3600)
        return request
