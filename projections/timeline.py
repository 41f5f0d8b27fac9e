"""Mailbox time-travel: a session's mailbox at any position, which messages each step of each run consumed
and sent, and a message's causal chain across sessions. Pure: it folds the histories the caller read.

Everything comes from the session streams alone. A claim and a consume name their run and, when the
engine reported it, its step (the model request at that boundary); a claim without a reported step is
one step of its own: the claims one command appended together (consecutive positions). A consume
without a step belongs to the step that claimed the message. A send is the session's own record of it
(``MessageSent``), credited to the latest step of the run open when it was recorded.

Revert and fork follow the session's log: a step or run with a claim, a consume or its start in a
reverted range is marked with the revert's position (it happened, then the engine took it back; the
restored mail is pending again); a fork's timeline opens with the source's steps up to the fork's
position (what the forked agent had already seen), marked with the source's id, and an empty mailbox
(the source's pending mail stays with the source).

The causal chain of a message walks back from its sender's run: the messages that run had consumed
before the send was recorded caused it, and so on up. The trace id is the OpenTelemetry trace the
message was prepared under (shared by prepare, admit, claim and consume); every message under it is
listed with the chain.
"""

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import NamedTuple

from treemail.domain import events as ev
from treemail.domain.tracecontext import trace_id

History = Sequence[tuple[int, ev.Event]]
Histories = Mapping[str, History]

# What a message is at a position: the mailbox's columns.
STATES = ("pending", "claimed", "consumed", "returned", "parked", "discarded")
_KIND = {
    ev.ProducerMessageAdmitted: ("admitted", "pending"),
    ev.ProducerMessageClaimed: ("claimed", "claimed"),
    ev.ProducerMessageReleased: ("released", "pending"),
    ev.ProducerMessageConsumed: ("consumed", "consumed"),
    ev.ProducerMessageParked: ("parked", "parked"),
    ev.ProducerMessageRetried: ("retried", "pending"),
    # Reported by the pump: no rule can end it any more (still pending until a person ends it).
    ev.ProducerMessageStranded: ("stranded", "pending"),
    ev.ProducerMessageRestored: ("restored", "pending"),
    # Flow control: steer mail queued for the next run start.
    ev.ProducerMessageSteerFellBack: ("steer_fell_back", "pending"),
}
# How far a causal chain walks back (a loop between agents would otherwise never end).
MAX_CHAIN = 64


@dataclass
class Transition:
    position: int
    at: float
    kind: str
    run_id: str | None = None
    step: int | None = None
    reason: str = ""
    tokens: int | None = None
    # A cancel's answer: who asked ("host", "sender", "ancestor").
    by: str | None = None


@dataclass
class Message:
    message_id: str
    session_id: str
    owner: str
    sender_session_id: str | None
    sender_handle: str | None
    mode: str
    body: str
    position: int
    at: float
    trace_id: str | None
    state: str = "pending"
    run_id: str | None = None
    step: int | None = None
    tokens: int | None = None
    reason: str = ""
    lifecycle: list[Transition] = field(default_factory=list)
    # threads: the conversation it belongs to (its own id when it starts one) and the message it answers
    thread_id: str | None = None
    in_reply_to: str | None = None
    # Discarded as superseded: the newer message that took its place.
    superseded_by: str | None = None


@dataclass
class Step:
    run_id: str
    step: int
    # False: the engine did not report a step number; this one counts the run's claims.
    reported: bool
    first: int
    last: int
    claimed: list[str] = field(default_factory=list)
    consumed: list[str] = field(default_factory=list)
    sent: list[str] = field(default_factory=list)
    tokens: int = 0
    reverted_by: int | None = None
    inherited_from: str | None = None


@dataclass
class Run:
    run_id: str
    started: int | None
    finished: int | None = None
    reason: str | None = None
    steps: list[Step] = field(default_factory=list)
    reverted_by: int | None = None
    inherited_from: str | None = None


class Position(NamedTuple):
    """One position of the session's stream, the type of the event there and when it was appended."""

    position: int
    event_type: str
    at: float


@dataclass
class Timeline:
    session_id: str
    handle: str | None
    at: int
    last: int
    messages: list[Message]
    runs: list[Run]
    # Sends recorded while no run was open (a host's own send).
    sent_outside_runs: list[str] = field(default_factory=list)
    reverts: list[dict] = field(default_factory=list)
    fork: dict | None = None
    # Every position: what a scrubber moves through.
    positions: list["Position"] = field(default_factory=list)
    # threads: the conversations the session took part in by then, each a reply tree (``threads``)
    threads: list["Thread"] = field(default_factory=list)

    def mailbox(self) -> dict[str, list[Message]]:
        by_state: dict[str, list[Message]] = {state: [] for state in STATES}
        for message in self.messages:
            by_state[message.state].append(message)
        return by_state

    def to_json(self) -> dict:
        data = asdict(self)
        data["mailbox"] = {state: [m.message_id for m in found] for state, found in self.mailbox().items()}
        return data


def position_at_time(history: History, at: float) -> int:
    """The last position appended at or before ``at`` (0: before the session's first event)."""
    found = 0
    for seq, event in history:
        if event.at <= at:
            found = seq
    return found


def _returned(reason: str) -> bool:
    return "returned" in reason or reason.startswith("recipient disposed")


class _Fold:
    def __init__(self, session_id: str) -> None:
        self.session_id = session_id
        self.handle: str | None = None
        self.messages: dict[str, Message] = {}
        self.runs: dict[str, Run] = {}
        self.current: str | None = None
        self.latest_step: dict[str, Step] = {}
        self.claim_step: dict[str, tuple[str, int]] = {}
        self.previous: tuple[int, ev.Event] | None = None
        self.outside: list[str] = []
        self.sent_ids: set[str] = set()
        self.reverts: list[dict] = []
        self.fork: dict | None = None
        self.positions: list[Position] = []

    def run(self, run_id: str) -> Run:
        if run_id not in self.runs:
            self.runs[run_id] = Run(run_id, started=None)
        return self.runs[run_id]

    def step(self, run_id: str, number: int, reported: bool, seq: int) -> Step:
        run = self.run(run_id)
        for step in run.steps:
            if step.step == number:
                step.last = max(step.last, seq)
                break
        else:
            step = Step(run_id, number, reported, first=seq, last=seq)
            run.steps.append(step)
        self.latest_step[run_id] = step
        return step

    def claimed(self, seq: int, event: ev.ProducerMessageClaimed) -> Step:
        run_id = event.run_id or ""
        if event.step is not None:
            return self.step(run_id, event.step, True, seq)
        prev = self.previous
        same_claim = (prev is not None and prev[0] == seq - 1 and isinstance(prev[1], ev.ProducerMessageClaimed)
                      and prev[1].run_id == event.run_id and prev[1].step is None)
        steps = self.run(run_id).steps
        if same_claim and steps:
            return self.step(run_id, self.latest_step[run_id].step, False, seq)
        return self.step(run_id, max((s.step for s in steps), default=0) + 1, False, seq)

    def apply(self, seq: int, event: ev.Event) -> None:
        self.positions.append(Position(seq, type(event).__name__, event.at))
        match event:
            case ev.SessionRegistered():
                self.handle = event.handle
            case ev.SessionForked():
                self.fork = {"source_session_id": event.source_session_id, "at_position": event.at_position}
            case ev.SessionRunStarted():
                run = self.run(event.run_id)
                run.started = seq if run.started is None else run.started
                self.current = event.run_id
            case ev.SessionRunFinished():
                run = self.run(event.run_id)
                run.finished, run.reason = seq, event.reason
                if self.current == event.run_id:
                    self.current = None
            case ev.SessionReverted():
                self.revert(seq, event)
            case ev.MessageSent() | ev.PeerIntentStored():
                # A peer message is sent when its intent is stored, in its run; its receipt comes later.
                self.sent(seq, event.message_id)
            case ev.ProducerMessageAccepted():
                self.messages[event.message_id] = Message(
                    event.message_id, self.session_id, event.owner, event.sender_session_id, event.sender_handle,
                    event.mode, event.body, seq, event.at, trace_id(event.traceparent),
                    lifecycle=[Transition(seq, event.at, "accepted", event.run_id)],
                    thread_id=event.thread_of, in_reply_to=event.in_reply_to,
                )
            case ev.RunStepReported():
                # A step that claimed nothing: still one of the run's steps.
                self.step(event.run_id, event.step, True, seq)
            case ev.ProducerMessageDiscarded():
                self.transition(seq, event, "discarded", "returned" if _returned(event.reason) else "discarded")
                if event.superseded_by and event.message_id in self.messages:
                    self.messages[event.message_id].superseded_by = event.superseded_by
            case ev.MessageCancelAnswered() if event.message_id in self.messages:
                # Every cancel asked, whatever it answered: in the message's lifecycle, its state unchanged.
                self.messages[event.message_id].lifecycle.append(
                    Transition(seq, event.at, "cancel_answered", reason=event.outcome, by=event.by))
            case ev.MessageEvent() if type(event) in _KIND:
                kind, state = _KIND[type(event)]
                self.transition(seq, event, kind, state)
            case _:
                pass
        self.previous = (seq, event)

    def transition(self, seq: int, event: ev.MessageEvent, kind: str, state: str) -> None:
        step_no = getattr(event, "step", None)
        tokens = getattr(event, "tokens", None)
        if isinstance(event, ev.ProducerMessageClaimed):
            step = self.claimed(seq, event)
            step.claimed.append(event.message_id)
            step_no = step.step
            self.claim_step[event.message_id] = (step.run_id, step.step)
        elif isinstance(event, ev.ProducerMessageConsumed):
            run_id, claimed_in = self.claim_step.get(event.message_id, (event.run_id or "", None))
            run_id = event.run_id or run_id
            number = step_no if step_no is not None else claimed_in
            if number is None:
                number = self.latest_step[run_id].step if run_id in self.latest_step else 1
            step = self.step(run_id, number, step_no is not None, seq)
            step.consumed.append(event.message_id)
            step.tokens += tokens or 0
            step_no = number
        message = self.messages.get(event.message_id)
        if message is None:
            return
        reason = getattr(event, "reason", "") or ""
        message.lifecycle.append(Transition(seq, event.at, kind, event.run_id, step_no, reason, tokens))
        message.state, message.reason = state, reason
        if kind in ("claimed", "consumed"):
            message.run_id, message.step = event.run_id, step_no
            message.tokens = tokens if tokens is not None else message.tokens
        elif state == "pending":
            message.run_id, message.step = None, None

    def sent(self, seq: int, message_id: str) -> None:
        """Credited once, where it was first recorded: a peer message's receipt, and the record a revert of its
        recipient writes again (restored), are not sends of their own."""
        if message_id in self.sent_ids:
            return
        self.sent_ids.add(message_id)
        run_id = self.current
        if run_id is None:
            self.outside.append(message_id)
            return
        step = self.latest_step.get(run_id)
        if step is None:
            # Sent before the run's first boundary: its step 0.
            step = self.step(run_id, 0, False, seq)
        step.last = max(step.last, seq)
        step.sent.append(message_id)

    def revert(self, seq: int, event: ev.SessionReverted) -> None:
        self.reverts.append({"position": seq, "to_position": event.to_position, "from_position": event.from_position})

        def abandoned(position: int | None) -> bool:
            return position is not None and event.to_position < position <= event.from_position

        for run in self.runs.values():
            if run.reverted_by is None and abandoned(run.started):
                run.reverted_by = seq
            for step in run.steps:
                if step.reverted_by is None and (abandoned(step.first) or abandoned(step.last)):
                    step.reverted_by = seq


def timeline(session_id: str, histories: Histories, at: int | None = None) -> Timeline:
    """The session's timeline as of position ``at`` (its last by default); a fork's source is read from
    ``histories`` when it is there."""
    history = histories.get(session_id, ())
    last = history[-1][0] if history else 0
    at = last if at is None else max(0, min(at, last))
    fold = _Fold(session_id)
    for seq, event in history:
        if seq > at:
            break
        fold.apply(seq, event)
    runs = list(fold.runs.values())
    if fold.fork is not None and fold.fork["source_session_id"] in histories and \
            fold.fork["source_session_id"] != session_id:
        source = timeline(fold.fork["source_session_id"], histories, fold.fork["at_position"])
        runs = [_inherited(run, source.session_id) for run in source.runs if run.reverted_by is None] + runs
    return Timeline(session_id, fold.handle, at, last, list(fold.messages.values()), runs, fold.outside,
                    fold.reverts, fold.fork, fold.positions, threads(session_id, histories, at))


def _inherited(run: Run, source: str) -> Run:
    steps = [Step(**{**asdict(s), "inherited_from": run.inherited_from or source}) for s in run.steps
             if s.reverted_by is None]
    return Run(run.run_id, run.started, run.finished, run.reason, steps, None, run.inherited_from or source)


@dataclass
class Post:
    """One message of a thread, placed under the message it answers (``depth``: how many replies deep)."""

    message_id: str
    depth: int
    in_reply_to: str | None
    sender_session_id: str | None
    sender_handle: str | None
    recipient_session_id: str
    # The recipient's handle, when its history was read.
    recipient_handle: str | None
    at: float
    body: str


@dataclass
class Thread:
    thread_id: str
    # Oldest first, each reply right under what it answers (a depth-first walk of the reply tree).
    posts: list[Post]


def threads(session_id: str, histories: Histories, at: int | None = None) -> list[Thread]:
    """The conversations ``session_id`` took part in, oldest first, each as a reply tree: the mail it received
    by position ``at`` and the mail it had recorded sending by then (``MessageSent``), found on its
    recipients' streams when ``histories`` holds them. A thread of one message is not listed (a message
    alone is not a conversation); a reply whose original is not in the histories read sits at the top."""
    own = histories.get(session_id, ())
    limit = own[-1][0] if own and at is None else (at or 0)
    sent = {e.message_id for seq, e in own if seq <= limit and isinstance(e, (ev.MessageSent, ev.PeerIntentStored))}
    handles = {sid: next((e.handle for _, e in h if isinstance(e, ev.SessionRegistered)), None)
               for sid, h in histories.items()}
    found: dict[str, Post] = {}
    thread_of: dict[str, str] = {}
    for recipient, history in histories.items():
        for seq, event in history:
            if not isinstance(event, ev.ProducerMessageAccepted) or event.message_id in found:
                continue
            mine = (recipient == session_id and seq <= limit) or event.message_id in sent
            if mine:
                # A notice is about a session (its sender_session_id), not written by it: no author shown.
                author = event.sender_session_id if event.owner == "agent" else None
                found[event.message_id] = Post(event.message_id, 0, event.in_reply_to, author,
                                               event.sender_handle, recipient, handles.get(recipient), event.at,
                                               event.body)
                thread_of[event.message_id] = event.thread_of
    by_thread: dict[str, list[Post]] = {}
    for post in sorted(found.values(), key=lambda p: (p.at, p.message_id)):
        by_thread.setdefault(thread_of[post.message_id], []).append(post)
    out = []
    for thread_id, posts in by_thread.items():
        if len(posts) < 2:
            continue
        ids = {p.message_id for p in posts}
        replies: dict[str | None, list[Post]] = {}
        for post in posts:
            replies.setdefault(post.in_reply_to if post.in_reply_to in ids else None, []).append(post)
        ordered: list[Post] = []
        stack = [(post, 0) for post in reversed(replies.get(None, []))]
        while stack:  # depth first, without recursion: a long back-and-forth is as deep as it is long
            post, depth = stack.pop()
            post.depth = depth
            ordered.append(post)
            stack += [(reply, depth + 1) for reply in reversed(replies.get(post.message_id, []))]
        out.append(Thread(thread_id, ordered))
    return out


@dataclass
class Link:
    """One message of a causal chain, where it landed, and the messages that caused it."""

    message: Message
    sent_by_run: str | None
    sent_at: int | None
    caused_by: list[str] = field(default_factory=list)
    # The handle of the session the message landed in.
    handle: str | None = None


def _where_accepted(histories: Histories) -> dict[str, str]:
    return {event.message_id: session_id for session_id, history in histories.items()
            for _, event in history if isinstance(event, ev.ProducerMessageAccepted)}


def causal_chain(message_id: str, histories: Histories) -> dict:
    """The message, the messages that caused it (walking back through the senders' runs) and every message
    under its trace id; each with its whole lifecycle. ``{}`` when no history holds the message."""
    accepted_in = _where_accepted(histories)
    if message_id not in accepted_in:
        return {}
    timelines: dict[str, Timeline] = {}

    def message(mid: str) -> Message:
        session = accepted_in[mid]
        if session not in timelines:
            timelines[session] = timeline(session, histories)
        return next(m for m in timelines[session].messages if m.message_id == mid)

    links: list[Link] = []
    queue, seen = [message_id], {message_id}
    while queue and len(links) < MAX_CHAIN:
        mid = queue.pop(0)
        found = message(mid)
        run_id, sent_at, causes = _causes(found, histories)
        links.append(Link(found, run_id, sent_at, causes, timelines[found.session_id].handle))
        for cause in causes:
            if cause in accepted_in and cause not in seen:
                seen.add(cause)
                queue.append(cause)
    root = links[0].message
    same_trace = []
    if root.trace_id:
        same_trace = sorted(
            (message(mid) for mid in accepted_in
             if (m := message(mid)).trace_id == root.trace_id), key=lambda m: (m.at, m.position))
    return {
        "message_id": message_id,
        "trace_id": root.trace_id,
        "chain": [asdict(link) for link in links],
        # Causes found but not walked once the chain reached its bound: the page says how many.
        "not_followed": len(queue), "max_chain": MAX_CHAIN,
        "trace": [asdict(m) for m in same_trace],
        "handles": {sid: found.handle for sid, found in timelines.items()},
    }


def _causes(message: Message, histories: Histories) -> tuple[str | None, int | None, list[str]]:
    """The sender's run, where the send was recorded on the sender's stream, and what that run had consumed
    by then (in order)."""
    sender = message.sender_session_id
    run_id = message.lifecycle[0].run_id if message.lifecycle else None
    history = histories.get(sender or "", ())
    # Where it was first recorded: a peer message's intent, before its receipt at the admission.
    sent_at = next((seq for seq, e in history if isinstance(e, (ev.MessageSent, ev.PeerIntentStored))
                    and e.message_id == message.message_id), None)
    if not history or run_id is None:
        return run_id, sent_at, []
    limit = sent_at if sent_at is not None else history[-1][0]
    consumed = [e.message_id for seq, e in history
                if seq < limit and isinstance(e, ev.ProducerMessageConsumed) and e.run_id == run_id]
    return run_id, sent_at, consumed
