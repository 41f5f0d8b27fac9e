"""What the host does to a session: register, status, runs, claims, acknowledgements, injected mail.

Each decide function takes its command first and what was loaded after
(``Given``) and returns the events to append; an empty list means nothing to
do, which is how a repeated command stays harmless. An illegal transition
raises ``LifecycleError`` with its stable code and changes nothing.

A little over the house's 200 lines: one decide function per host lifecycle command.
"""

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from .. import events as ev
from ..commands import (
    AnnounceSession,
    ChangeStatus,
    ClaimMail,
    ClaimTurn,
    ConsumeMail,
    DiscardMail,
    FinishRun,
    InjectMail,
    RegisterSession,
    ReleaseMail,
    RequestWake,
    StartRun,
)
from ..errors import LifecycleError, Rejected
from ..messaging import MessagingConfig
from ..outbound import Sender
from ..state import MailItem, SessionState
from .guards import require_body
from .obligations import RUN_FINISHED, WAKE_UNCLAIMED, fail_attempt, release_at_boundary, unclaimed_at_finish
from . import ordering, steer
from .settlement import owed, settle_with
from .wake import decide_reconcile_wake, with_wake
from .mailcontrol import claimable_now


@dataclass(frozen=True)
class Given:
    """What a session command is decided on: the folded state, its pending mail, the limits, the clock, and
    the senders whose records the decision writes."""

    state: SessionState
    mail: Mapping[str, MailItem]
    config: MessagingConfig
    now: float = 0.0
    # (position, event) of the stream a revert or fork reads (``Handler.reads_history``); empty otherwise.
    history: Sequence[tuple[int, ev.Event]] = ()
    # The session's id and its stream's position ``state`` was folded at: where the senders' records point.
    session_id: str = ""
    version: int = 0
    # The senders of the mail the command touches (``Handler.reads_senders``), None for one the same
    # atomic step cannot write; their records of the decision go on their streams.
    senders: Mapping[str, Sender | None] = field(default_factory=dict)


def require_registered(state: SessionState) -> None:
    if not state.registered:
        raise LifecycleError("lifecycle:unknown_session", "the session is not registered")


def require_mail(mail: Mapping[str, MailItem], message_id: str) -> MailItem:
    item = mail.get(message_id)
    if item is None:
        raise LifecycleError("lifecycle:unknown_message", f"message {message_id} is not pending on this session")
    return item


def require_claimed(item: MailItem) -> None:
    if item.state != "claimed":
        raise LifecycleError("lifecycle:not_claimed", f"message {item.message_id} is {item.state}, not claimed")


def require_open(state: SessionState) -> None:
    """A session being disposed (or disposed) starts no run and takes no new mail (the disposal cutoff)."""
    if state.disposal is not None:
        raise LifecycleError("lifecycle:closing", f"the session is {state.disposal}: it takes no new runs or mail")


def require_current_run(state: SessionState, run_id: str) -> None:
    if state.current_run != run_id:
        raise LifecycleError("lifecycle:not_current_run", f"run {run_id} is not the session's current run")


def message_event(cls, item: MailItem, run_id: str | None, now: float, **extra) -> ev.MessageEvent:
    return cls(
        at=now, message_id=item.message_id, owner=item.owner, sender_session_id=item.sender_session_id,
        agent_hop=item.agent_hop, run_id=run_id, **extra,
    )


def in_order(mail: Mapping[str, MailItem]) -> list[MailItem]:
    return sorted(mail.values(), key=lambda m: m.seq)


def _parent_of(command) -> str | None:
    """The parent a registration (or a fork's registration) names."""
    return getattr(getattr(command, "registration", command), "parent_session_id", None)


def registration_parent(command, _mail=None, _history=()) -> set[str]:
    """The parent a child's registration is decided against (``Handler.reads_senders``)."""
    parent = _parent_of(command)
    return {parent} if parent else set()


def held_parent(command, given: Given, _events) -> dict[str, list[ev.Event]]:
    """The parent's stream joins the registration's atomic step with no event of its own: its etag is checked,
    so a registration decided before a cascading stop sealed the parent is decided again, and refused."""
    parent = _parent_of(command)
    return {parent: []} if parent and given.senders.get(parent) is not None else {}


def require_parent_unsealed(parent_session_id: str, parent_state: SessionState) -> None:
    if parent_state.sealed:
        raise LifecycleError(
            "lifecycle:parent_stopped",
            f"session {parent_session_id} was stopped by a cascading stop; it takes no new children",
        )


def decide_register(command: RegisterSession, given: Given) -> list[ev.Event]:
    if given.state.registered:
        return []
    parent = given.senders.get(command.parent_session_id) if command.parent_session_id else None
    if parent is not None:
        require_parent_unsealed(command.parent_session_id, parent.state)
    registered = ev.SessionRegistered(
        at=given.now, session_id=command.session_id, root_session_id=command.root_session_id,
        parent_session_id=command.parent_session_id, agent_type=command.agent_type,
        description=command.description, handle=command.handle, rules=command.rules,
        send_message_tool=command.send_message_tool, status=command.status,
        resident=command.resident, continuable=command.continuable, accepts_images=command.accepts_images,
        interrupt_rules=command.interrupt_rules,
    )
    return [registered, *(announcing(SessionState(), None, given.now) if command.announced else [])]


def announcing(state: SessionState, run_id: str | None, now: float) -> list[ev.Event]:
    """The announcement of a child its host gave the task directly, once: a session already announced (sent
    mail, or announced before) owes its parent the same one notice, so nothing is written again."""
    return [] if state.announced else [ev.SessionAnnounced(at=now, run_id=run_id)]


def decide_announce(command: AnnounceSession, given: Given) -> list[ev.Event]:
    require_registered(given.state)
    return announcing(given.state, None, given.now)


def decide_status(command: ChangeStatus, given: Given) -> list[ev.Event]:
    require_registered(given.state)
    if given.state.status == command.status:
        return []
    return with_wake(given.state, [ev.SessionStatusChanged(at=given.now, status=command.status)], given.now, given.mail)


def decide_start_run(command: StartRun, given: Given) -> list[ev.Event]:
    """A run starts: every pending, unclaimed message is admitted into it as its input."""
    state, run_id = given.state, command.run_id
    require_registered(state)
    if state.current_run == run_id:
        return []
    require_open(state)
    if state.current_run is not None:
        raise LifecycleError(
            "lifecycle:run_active", f"run {state.current_run} is still active; finish it before starting {run_id}"
        )
    events: list[ev.Event] = [ev.SessionRunStarted(at=given.now, run_id=run_id)]
    if command.announced:
        events += announcing(state, run_id, given.now)
    for item in in_order(given.mail):
        if item.state not in ("claimed", "parked"):
            events.append(message_event(ev.ProducerMessageAdmitted, item, run_id, given.now))
    return events


def claimable(item: MailItem) -> bool:
    """Due in some run (``due_in_run`` says which): kept in the session's due index, read by a claim.

    A claim then reads what it may take, not every pending message: a backlog
    of queued or already claimed mail costs it nothing.
    """
    return item.state in ("admitted", "released") or (item.state == "accepted" and item.mode == "steer")


def due_in_run(item: MailItem, run_id: str) -> bool:
    """Due at this boundary: admitted to this run, released, or steer mail joining the running turn."""
    if item.state == "admitted":
        return item.run_id == run_id
    if item.state == "released":
        return True
    return item.state == "accepted" and item.mode == "steer"


def decide_claim(command: ClaimMail, given: Given) -> list[ev.Event]:
    step = {} if command.step is None else {"step": command.step}
    claims = claim_events(given, command.run_id, due_in_run, **step)
    if claims or command.step is None or given.state.disposal is not None:
        return claims
    # A reported step that took no mail is still a step of the run: recorded, so the run's steps can be
    # counted from its history (a repeated report of one step folds into that one step).
    return [ev.RunStepReported(at=given.now, run_id=command.run_id, step=command.step)]


def claim_events(given: Given, run_id: str, due: Callable[[MailItem, str], bool], **step) -> list[ev.Event]:
    """The claims of the mail ``due`` at this boundary of ``run_id``, in claim order. Past the disposal cutoff
    nothing more is delivered (what is pending goes back to its senders); a failed attempt's message waits out
    its backoff (mail as an obligation); an expired one never reaches a model."""
    require_registered(given.state)
    require_current_run(given.state, run_id)
    if given.state.disposal is not None:
        return []
    taken = claimed_in_order([m for m in given.mail.values() if due(m, run_id) and claimable_now(m, given.now)],
                             given)
    return [message_event(ev.ProducerMessageClaimed, item, run_id, given.now, **step) for item in taken]


def claimed_in_order(candidates: list[MailItem], given: Given) -> list[MailItem]:
    """What a claim hands out of the mail due at its boundary, and in which order (order and priority)."""
    return ordering.claim_order(ordering.held_back(candidates, given.now), given.config.urgent_starvation_bound)


def due_at_turn(item: MailItem, run_id: str) -> bool:
    """Due at a new turn of this run: what is due at any boundary, and queued mail, the input of a turn."""
    return due_in_run(item, run_id) or (item.state == "accepted" and item.mode == "queue")


def decide_claim_turn(command: ClaimTurn, given: Given) -> list[ev.Event]:
    return claim_events(given, command.run_id, due_at_turn)


def decide_consume(command: ConsumeMail, given: Given) -> list[ev.Event]:
    require_registered(given.state)
    item = require_mail(given.mail, command.message_id)
    require_claimed(item)
    reported = {k: v for k, v in (("step", command.step), ("tokens", command.tokens)) if v is not None}
    if command.traceparent or item.trace:
        # Tracing: the run's next send continues this trace (``loops.cause_trace``).
        reported["traceparent"] = command.traceparent or item.trace
    return [message_event(ev.ProducerMessageConsumed, item, item.run_id, given.now, **reported)]


# A release's reason is the host's diagnostic, stored on the stream and shown by inspect: one line, short,
# so a stack trace or a model's whole error body never lands in every replay.
MAX_RELEASE_DETAIL = 200


def require_release_reason(reason: str) -> None:
    if len(reason) > MAX_RELEASE_DETAIL or not reason.isprintable():
        raise LifecycleError("lifecycle:invalid_reason", f"a release reason is one printable line of at most "
                             f"{MAX_RELEASE_DETAIL} characters, got {len(reason)} characters")


def decide_release(command: ReleaseMail, given: Given) -> list[ev.Event]:
    require_registered(given.state)
    require_release_reason(command.reason)
    item = require_mail(given.mail, command.message_id)
    require_claimed(item)
    # Flow control: the boundary that reaches the steer limit queues the message.
    return [release_at_boundary(item, given.now, detail=command.reason),
            *steer.at_release(item, given.config, given.state.current_run, given.now)]


def decide_discard(command: DiscardMail, given: Given) -> list[ev.Event]:
    require_registered(given.state)
    item = require_mail(given.mail, command.message_id)
    discarded = message_event(ev.ProducerMessageDiscarded, item, item.run_id, given.now, reason=command.reason)
    if item.retry_at > given.now and item.sender_session_id is not None:
        # Order: a message backing off holds the later mail of its pair; gone, that mail may be due now. The
        # decision reads this one item, so an asleep session with other mail pending is woken to take it.
        return with_wake(given.state, [discarded], given.now)
    return [discarded]


def decide_finish_run(command: FinishRun, given: Given) -> list[ev.Event]:
    """A run ends: each message due in it and not consumed is a failed attempt (counted, backed off 1-60 s,
    parked once the budget is spent), whether the run claimed it and never acknowledged it or never
    claimed it at all (a woken run whose provider failed before its first request): a session is never
    woken again and again for mail no run takes."""
    state, run_id = given.state, command.run_id
    require_registered(state)
    if state.current_run != run_id and state.last_run == run_id:
        # A repeated finish (the host retried, or died before it heard the answer): only what is still owed.
        return settled_with(command, given, [])
    require_current_run(state, run_id)
    # Cut short by its host's restart or by an abort: not its mail's failure. Claims are due again at once,
    # and mail it never took is not counted against.
    cut_short = command.interrupted or command.reason == "aborted"
    released = []
    # Held behind an earlier message of its pair (order): never the run's to take, so not its failure.
    held = ordering.held_by_pair([m for m in given.mail.values() if m.state in ("admitted", "released")], given.now)
    for item in in_order(given.mail):
        if item.state == "claimed" and item.run_id == run_id:
            released.append(fail_attempt(item, RUN_FINISHED, given.config, given.now, backoff=not cut_short))
        elif unclaimed_at_finish(item, run_id, given.now) and not cut_short and item.message_id not in held:
            released.append(fail_attempt(item, WAKE_UNCLAIMED, given.config, given.now, counted=False))
    # Flow control: steer mail no boundary of this run took is queued for the next, on the record.
    released += steer.at_finish(in_order(given.mail), state, run_id, given.now)
    finished = ev.SessionRunFinished(at=given.now, run_id=run_id, reason=command.reason)
    return settled_with(command, given, with_wake(state, [*released, finished], given.now, given.mail))


def settled_with(command: FinishRun, given: Given, events: list[ev.Event]) -> list[ev.Event]:
    """``events``, and the child's ``SessionSettled`` when the finish settles a run not settled yet (its
    parent's notice is written in the same step: ``settlement.settlement_elsewhere``)."""
    if command.settle is None or not owed(given.state, command.run_id, False):
        return events
    settled, _ = settle_with(command.settle, given.session_id, given.state, given.senders, command.run_id, False,
                             given.now)
    return [*events, settled]


def decide_inject(command: InjectMail, given: Given) -> list[ev.Event]:
    """Mail from the host's own producers: same lifecycle, own body cap, never counted by the agent guards."""
    state = given.state
    require_registered(state)
    require_open(state)
    try:
        require_body(command.body, given.config.max_injected_body_bytes)
    except Rejected as rejection:
        raise LifecycleError("lifecycle:invalid_body", rejection.message) from None
    producer_id = f"{command.owner}:host"
    events: list[ev.Event] = []
    if producer_id not in state.producers:
        events.append(ev.ProducerRegistered(at=given.now, producer_id=producer_id, owner=command.owner))
    events.append(
        ev.ProducerMessageAccepted(
            at=given.now, message_id=command.message_id, producer_id=producer_id, owner=command.owner,
            body=command.body, mode=command.mode,
        )
    )
    return with_wake(state, events, given.now)


def decide_request_wake(command: RequestWake, given: Given) -> list[ev.Event]:
    require_registered(given.state)
    return decide_reconcile_wake(given.state, given.now)
