"""decide_interrupt: the model's interrupt_agent, from what was loaded to events, a no-op, or a refusal.

An interrupt stops a direct neighbour's current run at its next safe point:
the decision records ``SessionInterruptRequested`` on the target's stream
(its trigger reaches a host runner in the same atomic step), and the host
later reports ``SessionRunFinished`` with reason ``aborted``: the child stays
resident and idle, the same incarnation, and its waiting mail is held until a
later send wakes it (``abort_hold``).

Only a resident continuable child's open run is interrupted. Every other
target is an accepted no-op that touches nothing (no event, no record on its
keys): one that is absent, settled (being disposed or disposed), one-shot, or
with no run open (queued, idle, already completed). The result says which
(``{"result": "no_op", "reason": ...}``).

Idempotent per tool call like send_message: the key is the tool call
(namespaced apart from send_message's), and an interrupt is recorded under it,
so a retry gets the first answer even if the run has ended since: the record
is answered before any check. A no-op is not recorded (it touches nothing)
and is decided again; refusals depend only on the registrations and the
caller's run (exact live sender: only the caller's open run may interrupt, as
only it may send) and are decided again.
"""

from dataclasses import dataclass

from .. import actions, digests, permissions
from .. import events as ev
from ..commands import InterruptAgent, InterruptArguments, SendContext
from ..errors import Code, Rejected
from ..records import SessionRecord
from ..results import clip
from ..state import SessionState
from . import guards, idempotency, routing
from .guards import Found, Target, render_peer
from .send import Accepted, Refused, Replayed

InterruptDecision = Accepted | Refused | Replayed


@dataclass(frozen=True)
class InterruptGiven:
    sender: SessionRecord | None
    sender_state: SessionState
    target: Target
    # The interrupt's id, if one is requested.
    new_id: str = ""
    now: float = 0.0
    # The idempotency record of this tool call, if it was decided before: it is answered from it.
    recorded: list | dict | None = None


def require_target(sender: SessionRecord, target: Target) -> Found:
    found = guards.require_known(target, Code.INTERRUPT_UNKNOWN_SESSION, lambda unknown: (
        f"unknown agent reference `{unknown.reference}`: use a handle or session_id from this list of your "
        "direct neighbours:\n" + ("\n".join(f"- {render_peer(p)}" for p in unknown.peers)
                                  or "- (no agent you can interrupt)")
    ))
    if found.record.session_id == sender.session_id:
        raise Rejected(Code.INTERRUPT_SELF, "you cannot interrupt yourself; to stop, end your turn")
    return found


def require_live_caller(state: SessionState, run_id: str) -> None:
    """Exact live sender, for interrupts too: only the caller's open run may interrupt."""
    if state.current_run is None or state.current_run != run_id:
        raise Rejected(
            Code.INTERRUPT_SENDER_NOT_LIVE,
            f"interrupting requires the exact live agent: run {clip(run_id, 80)} is not this session's open run; "
            "nothing was interrupted",
        )


def decide_interrupt(command: InterruptAgent, given: InterruptGiven) -> InterruptDecision:
    sender = given.sender
    if given.recorded is not None:
        return Replayed(replayed_outcome(given.recorded, command.arguments))
    try:
        if sender is None or not given.sender_state.registered:
            raise Rejected(Code.INTERRUPT_UNKNOWN_SESSION, "the interrupting session is not registered with treemail")
        require_live_caller(given.sender_state, command.context.run_id)
        if not actions.interrupt_visible(sender.interrupt_rules):
            raise Rejected(Code.INTERRUPT_PERMISSION_DENIED, "permission denied: this agent has no interrupt_agent tool")
        try:
            found = require_target(sender, given.target)
        except Rejected as unknown:
            if unknown.code != Code.INTERRUPT_UNKNOWN_SESSION:
                raise
            # Interrupting an agent that does not exist (or no longer does) stops nothing that runs: an
            # accepted no-op, which still tells the model whom it could have meant.
            return no_op("absent", None, f"nothing was done: {unknown.message}")
        routing.require_direct(sender, found.record, routing.INTERRUPT)
        label = permissions.relationship(sender.origin, found.record.origin)
        if permissions.evaluate(sender.interrupt_rules, label) != "allow":
            raise Rejected(Code.INTERRUPT_PERMISSION_DENIED, f"permission denied: interrupt your {label}")
    except Rejected as rejection:
        return Refused(rejection.code, rejection.message)
    state, handle = found.state, found.record.handle
    why = nothing_to_interrupt(state)
    if why is not None:
        return no_op(why, handle, NO_OP_MESSAGES[why].format(handle=handle, status=state.status),
                     recipient_state=state.status)
    event = ev.SessionInterruptRequested(
        at=given.now, interrupt_id=given.new_id, run_id=state.current_run, sender_session_id=sender.session_id,
        sender_handle=sender.handle, reason=command.arguments.reason, tool_call_id=command.context.tool_call_id,
    )
    return Accepted([event], {
        "result": "interrupt_requested", "interrupt_id": given.new_id, "agent": handle,
        "message": f"{handle}'s current run will stop at its next step",
    })


# ---- no-ops ----------------------------------------------------------------------------------------

NO_OP_MESSAGES = {
    "settled": "{handle} has been disposed; there is nothing to interrupt and nothing was done",
    "one_shot": "{handle} is a one-shot agent, which is not interrupted; nothing was done",
    "not_running": "{handle} is {status} with no run to interrupt; nothing was done",
}


def nothing_to_interrupt(state: SessionState) -> str | None:
    """Why a target's run is not interrupted, or None when it is: only a resident continuable child with an
    open run is; a settled or one-shot one is left exactly as it is, whatever it is doing."""
    if state.disposal is not None:
        return "settled"
    if not state.continuable:
        return "one_shot"
    if state.current_run is None:
        return "not_running"
    return None


def no_op(reason: str, handle: str | None, message: str, **more) -> Accepted:
    """An accepted interrupt that does nothing: no event anywhere, and nothing recorded under the tool call."""
    return Accepted([], {"result": "no_op", "reason": reason, "agent": handle, **more, "message": message})


def is_no_op(decision) -> bool:
    return isinstance(decision, Accepted) and decision.result.get("result") == "no_op"


# ---- idempotency ---------------------------------------------------------------------------------

CONFLICT_MESSAGE = (
    "this tool call was already used to interrupt with different arguments; make a new tool call to interrupt again"
)


def key_digest(context: SendContext) -> str:
    return digests.digest(["interrupt_agent", context.session_id, context.run_id, context.tool_call_id])


def fingerprint(arguments: InterruptArguments) -> str:
    return digests.digest([arguments.to, arguments.reason])


INTERRUPTS = idempotency.Keyed(fingerprint, Code.INTERRUPT_IDEMPOTENCY_CONFLICT, CONFLICT_MESSAGE)
record = INTERRUPTS.record
replayed_outcome = INTERRUPTS.replayed_outcome
