"""A person's answer to an approval request, decided on the sender's stream."""

from .. import events as ev
from ..commands import ResolveApproval
from ..errors import LifecycleError
from .lifecycle import Given, require_registered


def decide_resolve_approval(command: ResolveApproval, given: Given) -> list[ev.Event]:
    require_registered(given.state)
    found = [(key, entry) for key, entry in given.state.approvals.items() if entry.request_id == command.request_id]
    if not found:
        raise LifecycleError("approval:unknown_request", f"no approval request has id {command.request_id}")
    key, entry = found[0]
    if entry.status != "pending":
        raise LifecycleError(
            "approval:already_decided", f"approval request {command.request_id} is already {entry.status}"
        )
    if command.decision == "deny":
        return [ev.ApprovalDenied(at=given.now, request_id=command.request_id, key=key)]
    scope = "tree" if command.decision == "approve_tree" else "once"
    return [ev.ApprovalGranted(at=given.now, request_id=command.request_id, key=key, scope=scope, label=entry.label)]
