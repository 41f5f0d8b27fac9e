"""Builders for given/when/then unit tests: session records, trees, event histories.

State is never constructed by hand: a test lists the events that happened and
folds them, exactly as the service layer rebuilds it from a stream.
"""

from dataclasses import dataclass, replace
from functools import reduce

from treemail.domain import events as ev
from treemail.domain import state as st
from treemail.domain.commands import SendArguments, SendContext, SendMessage
from treemail.domain.decide import idempotency
from treemail.domain.decide.guards import Found, Target
from treemail.domain.decide.lifecycle import Given
from treemail.domain.decide.send import SendGiven, approval_fingerprint, decide_send
from treemail.domain.messaging import MessagingConfig
from treemail.domain.records import SessionRecord

ROOT_ID = "0190a000-0000-7000-8000-000000000001"
CHILD_ID = "0190a000-0000-7000-8000-000000000002"
SIBLING_ID = "0190a000-0000-7000-8000-000000000003"
GRANDCHILD_ID = "0190a000-0000-7000-8000-000000000004"
STRANGER_ID = "0190a000-0000-7000-8000-0000000000ff"
NOBODY_ID = "0190a000-0000-7000-8000-00000000dead"

ALLOW_ALL = [("*", "allow")]


def session_record(
    session_id: str,
    *,
    root: str | None = None,
    parent: str | None = None,
    agent_type: str = "explore",
    description: str = "",
    handle: str | None = None,
    rules: list[tuple[str, str]] | None = None,
    send_message_tool: bool = True,
) -> SessionRecord:
    return SessionRecord(
        session_id=session_id,
        root_session_id=root or session_id,
        parent_session_id=parent,
        agent_type=agent_type,
        description=description or f"{agent_type} agent",
        handle=handle or f"{agent_type}_{session_id[-8:]}",
        rules=list(ALLOW_ALL if rules is None else rules),
        send_message_tool=send_message_tool,
        partition=0,
    )


@dataclass(frozen=True)
class Tree:
    """root ─┬─ child ── grandchild
             └─ sibling            and a stranger rooted elsewhere."""

    root: SessionRecord
    child: SessionRecord
    sibling: SessionRecord
    grandchild: SessionRecord
    stranger: SessionRecord

    def with_rules(self, name: str, rules) -> "Tree":
        return replace(self, **{name: replace(getattr(self, name), rules=list(rules))})


def tree(rules: list[tuple[str, str]] | None = None) -> Tree:
    return Tree(
        root=session_record(ROOT_ID, agent_type="plan", rules=rules),
        child=session_record(CHILD_ID, root=ROOT_ID, parent=ROOT_ID, agent_type="explore", rules=rules),
        sibling=session_record(SIBLING_ID, root=ROOT_ID, parent=ROOT_ID, agent_type="review", rules=rules),
        grandchild=session_record(GRANDCHILD_ID, root=ROOT_ID, parent=CHILD_ID, agent_type="grep", rules=rules),
        stranger=session_record(STRANGER_ID, agent_type="explore", rules=rules),
    )


# ---- events ----------------------------------------------------------------------------------


def registered(record: SessionRecord, status: str = "running") -> ev.SessionRegistered:
    return ev.SessionRegistered(
        session_id=record.session_id,
        root_session_id=record.root_session_id,
        parent_session_id=record.parent_session_id,
        agent_type=record.agent_type,
        description=record.description,
        handle=record.handle,
        rules=record.rules,
        send_message_tool=record.send_message_tool,
        status=status,
    )


def accepted(
    message_id: str,
    sender: SessionRecord | None = None,
    *,
    owner: str = "agent",
    mode: str = "steer",
    hop: int = 0,
    body: str = "hello",
) -> ev.ProducerMessageAccepted:
    sender_id = sender.session_id if sender and owner == "agent" else None
    return ev.ProducerMessageAccepted(
        message_id=message_id,
        producer_id=f"agent:{sender_id}" if owner == "agent" else f"{owner}:host",
        owner=owner,
        sender_session_id=sender_id,
        sender_handle=sender.handle if sender and owner == "agent" else None,
        body=body,
        mode=mode,
        agent_hop=hop,
    )


def _step(cls, message_id: str, sender: SessionRecord | None, run_id: str | None, owner: str, hop: int, **extra):
    return cls(
        message_id=message_id,
        owner=owner,
        sender_session_id=sender.session_id if sender and owner == "agent" else None,
        agent_hop=hop,
        run_id=run_id,
        **extra,
    )


def admitted(message_id, sender=None, run_id="run-1", *, owner="agent", hop=0):
    return _step(ev.ProducerMessageAdmitted, message_id, sender, run_id, owner, hop)


def claimed(message_id, sender=None, run_id="run-1", *, owner="agent", hop=0):
    return _step(ev.ProducerMessageClaimed, message_id, sender, run_id, owner, hop)


def released(message_id, sender=None, run_id="run-1", *, owner="agent", hop=0):
    return _step(ev.ProducerMessageReleased, message_id, sender, run_id, owner, hop)


def consumed(message_id, sender=None, run_id="run-1", *, owner="agent", hop=0):
    return _step(ev.ProducerMessageConsumed, message_id, sender, run_id, owner, hop)


def discarded(message_id, sender=None, run_id="run-1", *, owner="agent", hop=0, reason="dropped"):
    return _step(ev.ProducerMessageDiscarded, message_id, sender, run_id, owner, hop, reason=reason)


def run_started(run_id: str = "run-1") -> ev.SessionRunStarted:
    return ev.SessionRunStarted(run_id=run_id)


def run_finished(run_id: str = "run-1") -> ev.SessionRunFinished:
    return ev.SessionRunFinished(run_id=run_id)


def status_changed(status: str) -> ev.SessionStatusChanged:
    return ev.SessionStatusChanged(status=status)


# ---- folds -----------------------------------------------------------------------------------


def given(*events: ev.Event) -> st.SessionState:
    return st.fold(events)


def given_mail(*events: ev.Event) -> dict[str, st.MailItem]:
    return reduce(lambda mail, pair: st.evolve_mail(mail, pair[1], pair[0]), enumerate(events), {})


class History:
    """A growing session stream: append decided events, read state and mail as folds of it."""

    def __init__(self, *events: ev.Event) -> None:
        self.events: list[ev.Event] = list(events)

    def then(self, new_events: list[ev.Event]) -> list[ev.Event]:
        self.events.extend(new_events)
        return new_events

    @property
    def state(self) -> st.SessionState:
        return st.fold(self.events)

    @property
    def mail(self) -> dict[str, st.MailItem]:
        return given_mail(*self.events)


# ---- sends -----------------------------------------------------------------------------------


def config(**overrides) -> MessagingConfig:
    return MessagingConfig(**overrides)


def context(sender: SessionRecord, run_id: str = "run-1", tool_call_id: str = "call-1") -> SendContext:
    return SendContext(session_id=sender.session_id, run_id=run_id, tool_call_id=tool_call_id)


def found(record: SessionRecord, *events: ev.Event) -> Found:
    """The recipient as the loader finds it; a registration event is prepended when none is given."""
    if not any(isinstance(e, ev.SessionRegistered) for e in events):
        events = (registered(record), *events)
    return Found(record, st.fold(events))


def approval_events(
    sender: SessionRecord, recipient_id: str, status: str, *, to: str, body: str, mode: str, run_id: str,
    tool_call_id: str, request_id: str = "req-1", label: str = "sibling",
) -> list[ev.Event]:
    """What the sender's stream holds once a person was asked about exactly this send, and answered."""
    key = idempotency.key_digest(SendContext(sender.session_id, run_id, tool_call_id))
    fp = approval_fingerprint(recipient_id, SendArguments(to=to, body=body, mode=mode))
    events: list[ev.Event] = [ev.ApprovalRequested(
        request_id=request_id, key=key, fingerprint=fp, sender_session_id=sender.session_id,
        sender_handle=sender.handle, recipient_session_id=recipient_id, recipient_handle="", label=label,
        body=body, mode=mode,
    )]
    if status == "approved":
        events.append(ev.ApprovalGranted(request_id=request_id, key=key, scope="once", label=label))
    elif status == "denied":
        events.append(ev.ApprovalDenied(request_id=request_id, key=key))
    return events


def send(
    sender: SessionRecord | None,
    target: Target,
    *,
    body: str = "hello",
    mode: str = "steer",
    to: str = "explore_00000002",
    sender_events: tuple[ev.Event, ...] | None = None,
    cfg: MessagingConfig | None = None,
    run_id: str = "run-1",
    tool_call_id: str = "call-1",
    approval: str | None = None,
    tree_granted: bool = False,
    message_id: str = "m-1",
    recorded: dict | None = None,
    service_draining: bool = False,
    numbered: bool = False,
):
    """Decide one send. ``approval``: what a person already said about this exact send (None: never asked).
    ``recorded``: the idempotency record of this tool call, when it was decided before."""
    # The sender sends from its open run (only the exact live sender may send).
    events = list(sender_events) if sender_events is not None else (
        [registered(sender), run_started(run_id)] if sender else []
    )
    if approval is not None and sender is not None and isinstance(target, Found):
        events += approval_events(sender, target.record.session_id, approval, to=to, body=body, mode=mode,
                                  run_id=run_id, tool_call_id=tool_call_id)
    ctx = SendContext(session_id=sender.session_id if sender else NOBODY_ID, run_id=run_id, tool_call_id=tool_call_id)
    command = SendMessage("cmd-1", ctx, SendArguments(to=to, body=body, mode=mode, numbered=numbered),
                          "client-1")
    label = "sibling"
    given = SendGiven(
        sender=sender, sender_state=st.fold(events), target=target, config=cfg or config(),
        tree_grants=frozenset({label, "child", "parent", "*"}) if tree_granted else frozenset(),
        new_id=message_id, now=1.0, recorded=recorded, service_draining=service_draining,
    )
    return decide_send(command, given)


def given_lifecycle(h: "History", cfg: MessagingConfig | None = None, now: float = 0.0) -> Given:
    return Given(h.state, h.mail, cfg or config(), now)


# ---- session lifecycle -------------------------------------------------------------------------


def registered_as(record: SessionRecord, status: str = "running", continuable: bool = True) -> ev.SessionRegistered:
    return registered(record, status).model_copy(update={"continuable": continuable})


def closing(stop_reason: str | None = "aborted") -> ev.SessionClosing:
    return ev.SessionClosing(stop_reason=stop_reason)


def closed() -> ev.SessionClosed:
    return ev.SessionClosed()


def drain_started(by: str) -> ev.SessionDrainStarted:
    return ev.SessionDrainStarted(by=by)
