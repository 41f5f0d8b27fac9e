"""Fold of a session stream: ``initial``, ``evolve``. Pure.

Two read models come out of one stream and are kept beside it as snapshots:
``SessionState`` (small counters every send decision needs) and the session's
pending mail (one ``MailItem`` per message not yet consumed or discarded).
Both can be rebuilt by folding the stream from the start.

Over the house's 200 lines: the fold of the state, the fold of the mail and
``apply`` (what an append leaves beside the stream) stay together so that
the live path and a rebuild can never fold differently.
"""

import json
from dataclasses import dataclass, field
from typing import NamedTuple

import orjson

from . import compactjson, loops
from . import events as ev
from . import flow
from .frozen import replace
from .leasedruns import leased
from . import outbox as peer_outbox
from . import peers as peer_state

PENDING_STATES = ("accepted", "admitted", "claimed", "released")
# The reason an item shows while it waits for its recipient's disposal to settle (``next_incarnation``).
NEXT_INCARNATION = "next_incarnation"
MAX_PRODUCERS = 64
MAX_PAIR_COUNTERS = 32


class ApprovalEntry(NamedTuple):
    request_id: str
    # What the person was shown: the request covers this fingerprint and nothing else.
    fingerprint: str
    label: str
    status: str  # "pending", "approved", "denied"


@dataclass(frozen=True)
class SessionState:
    registered: bool = False
    status: str = "queued"
    current_run: str | None = None
    # Pending agent mail addressed to this session (the inbox cap counts these).
    pending_agent: int = 0
    # Pending mail of every owner: an idle session with any of it needs a wake.
    pending_all: int = 0
    # A wake was requested and no run has started since: one wake, however much mail arrives.
    wake_pending: bool = False
    # sender session id -> unacknowledged agent mail from it (the pair window).
    pair_inflight: dict[str, int] = field(default_factory=dict)
    # Producer ids registered on this session, least recently sending first, at most MAX_PRODUCERS:
    # the snapshot is rewritten on every append, so it must not keep one entry per sender ever seen.
    # A sender that fell off registers again (one more ProducerRegistered) when it next sends.
    producers: tuple[str, ...] = ()
    # run id -> highest hop of agent mail that run observed (admitted, claimed, consumed).
    run_hops: dict[str, int] = field(default_factory=dict)
    # Approval requests this session's sends opened: idempotency digest -> request.
    approvals: dict[str, "ApprovalEntry"] = field(default_factory=dict)
    # The host's overlay of message rules over the agent document's (empty: none).
    rules_overlay: tuple[tuple[str, str], ...] = ()
    # The optional model-facing tools the host installed for this session (``ToolsInstalled``).
    installed_tools: tuple[str, ...] = ()
    # Delivery as an obligation: this session's send intents not yet settled (its per-source capacity counts these),
    # and when the outstanding wake was requested (a wake unanswered for long may have been lost).
    outstanding: int = 0
    wake_requested_at: float = 0.0
    # Peer routes and grants leading to this session, and its peer inbox (``peers.py``).
    peers: peer_state.PeerState = peer_state.EMPTY
    # Peer mail as an outbox: this source's peer deliveries not yet processed or refused (``outbox.py``).
    outbox: dict[str, peer_outbox.Row] = field(default_factory=dict)
    # Whether the host can run it again (never woken if not), its disposal
    # (None, "closing", "closed"), the sessions whose drain covers it, and whether it was ever sent mail.
    continuable: bool = True
    disposal: str | None = None
    # A cascading stop reached it: no new children, and its disposal is for good (never a next incarnation).
    sealed: bool = False
    drained_by: frozenset[str] = frozenset()
    announced: bool = False
    # The run that finished last (a repeated finish of it is harmless), and what was settled last: that run's
    # id, or "disposed" (a settlement is written once, however often a finish or a disposal is repeated).
    last_run: str | None = None
    settled: str = ""
    settled_notice: str = ""
    # Its run was aborted (an interrupt): its mail waits, unwoken, until a new message or run (or a retry) comes.
    abort_hold: bool = False
    # Causation and loop detection (``loops.py``): run id -> (the last agent message it consumed, that one's
    # chain[, the consume's trace context, with tracing on]); pending agent mail of another message's chain -> the chain; sender -> what this session remembers of
    # its last message (the loop rule's mark); the chains whose loop notice was written here (once each).
    run_causes: dict[str, tuple[str, ...]] = field(default_factory=dict)
    chains: dict[str, str] = field(default_factory=dict)
    loop_marks: dict[str, loops.Mark] = field(default_factory=dict)
    loop_notices: tuple[str, ...] = ()
    # Supersede (``mailcontrol.py``): "<sender> <key>" -> the unclaimed message a newer one with that key replaces.
    superseding: dict[str, str] = field(default_factory=dict)
    # Flow control: the pace this session was seen to consume its mail at, and its own sends to be settled at
    # (``flow.Pace``): what a refusal's retry-after is computed from.
    consumed_pace: flow.Pace = flow.NOTHING
    settled_pace: flow.Pace = flow.NOTHING
    # Order and priority: sender session id -> the number of the last message it landed here (its pair's
    # counter), most recently numbered last, at most MAX_PAIR_COUNTERS of them beside the senders with mail
    # pending (the snapshot is rewritten on every append). A counter set aside raises ``pair_seq_floor``,
    # where a sender without one counts from: its numbers stay increasing, whatever it sent before.
    pair_seq: dict[str, int] = field(default_factory=dict)
    pair_seq_floor: int = 0
    # A leased run (an agent over streamable HTTP): when its agent was last recorded calling (its start, or
    # ``SessionRunRenewed``); 0 for any other run.
    run_seen_at: float = 0.0

    def to_json(self) -> str:
        """Only the fields that differ from a new session's (``from_json`` fills in the rest, as it does
        for a snapshot older than a field): the snapshot goes over the wire and into the state hash on
        every append, and most sessions leave most fields at their defaults. ``status`` is always
        written: the candidate list reads it from the snapshot inside the server (adapters/peers.lua).
        Compared before they are converted, and read from the instance dict: built for every append."""
        return compactjson.dumps({
            name: _SNAPSHOT_FORM[name](value) if name in _SNAPSHOT_FORM else value
            for name, value in self.__dict__.items() if name == "status" or value != _DEFAULT_VALUES[name]
        })

    @classmethod
    def from_json(cls, text: str | bytes | None) -> "SessionState":
        if not text:
            return INITIAL
        data = json.loads(text)
        data["producers"] = tuple(data.get("producers", ()))[-MAX_PRODUCERS:]
        data["approvals"] = {k: ApprovalEntry(*v) for k, v in data.get("approvals", {}).items()}
        data["rules_overlay"] = tuple(tuple(rule) for rule in data.get("rules_overlay", ()))
        data["installed_tools"] = tuple(data.get("installed_tools", ()))
        data["peers"] = peer_state.PeerState.from_obj(data["peers"]) if "peers" in data else peer_state.EMPTY
        data["drained_by"] = frozenset(data.get("drained_by", ()))
        data["outbox"] = {row[0]: peer_outbox.Row.from_list(row) for row in data.get("outbox", ())}
        data["run_causes"] = {k: tuple(v) for k, v in data.get("run_causes", {}).items()}
        data["loop_marks"] = {k: loops.Mark.from_list(v) for k, v in data.get("loop_marks", {}).items()}
        data["loop_notices"] = tuple(data.get("loop_notices", ()))
        data["consumed_pace"] = flow.Pace.of(data.get("consumed_pace"))
        data["settled_pace"] = flow.Pace.of(data.get("settled_pace"))
        # A snapshot written by a newer version may carry fields this one does not know.
        return cls(**{k: v for k, v in data.items() if k in _STATE_FIELDS})


INITIAL = SessionState()
_STATE_FIELDS = frozenset(SessionState.__dataclass_fields__)
_DEFAULT_VALUES = dict(INITIAL.__dict__)
# How the fields JSON has no form for are written (the rest are written as they are).
_SNAPSHOT_FORM = {
    "producers": list,
    "approvals": lambda approvals: {k: list(v) for k, v in approvals.items()},
    "rules_overlay": lambda rules: [list(rule) for rule in rules],
    "installed_tools": list,
    "peers": lambda peers: peers.to_obj(),
    "drained_by": sorted,
    "outbox": lambda rows: [row.to_list() for row in rows.values()],
    "run_causes": lambda causes: {k: list(v) for k, v in causes.items()},
    "loop_marks": lambda marks: {k: m.to_list() for k, m in marks.items()},
    "loop_notices": list,
    "consumed_pace": list,
    "settled_pace": list,
}


@dataclass(frozen=True)
class MailItem:
    message_id: str
    owner: str
    sender_session_id: str | None
    agent_hop: int
    mode: str
    state: str
    run_id: str | None
    # Position of the ProducerMessageAccepted event in the stream (the body lives there).
    seq: int
    # Delivery attempts (an item stored before them reads with these defaults): claims so far (attempts),
    # when the retry budget started (acceptance or the last explicit retry), when the current claim
    # was made, when a failed attempt is due again, the latest failure or parking reason, and the
    # W3C trace context the message was sent under.
    attempts: int = 0
    since: float = 0.0
    claimed_at: float = 0.0
    retry_at: float = 0.0
    reason: str = ""
    trace: str = ""
    # Peer mail: its sender is in another slot and learns of its settlement from a driver (``outbox.py``),
    # never from this session's step.
    peer: bool = False
    # Expiry and supersede: when it expires unclaimed (0: never), and its supersede key ("" none).
    expires_at: float = 0.0
    supersede_key: str = ""
    # Flow control: step boundaries that passed this steer message over (handed it back unconsumed).
    passed: int = 0
    # Order and priority: sent urgent. (Its number in its pair is on its accepted event: a pair's numbers follow
    # stream positions, so the position orders it, and every pending item stays as small as it was.)
    urgent: bool = False
    # Claims that handed it to a model and were never confirmed, so far (a claim handed back unshown at a
    # step boundary is taken off; never reset, not even by a retry): a later claim hands it out again, and the
    # recipient is told it saw it before (an MCP agent's envelope says ``shown_before``).
    shown: int = 0
    # The delivery pump reported that no rule can end it any more, and why (``decide/stranded.py``); "" not.
    stranded: str = ""

    def to_json(self) -> str:
        """Kept under its message id (the mail hash's field), so the id is not written again; the
        position comes first, and the fields still at their default at the end are left out (an item
        is written on every send and kept until it is processed)."""
        fields = [self.seq, self.owner, self.sender_session_id, self.agent_hop, self.mode, self.state,
                  self.run_id, self.attempts, self.since, self.claimed_at, self.retry_at, self.reason, self.trace, self.peer,
                  self.expires_at, self.supersede_key, self.passed, self.urgent, self.shown, self.stranded]
        while len(fields) > _ITEM_REQUIRED and fields[-1] == _ITEM_DEFAULTS[len(fields) - 1]:
            fields.pop()
        return compactjson.dumps(fields)

    @classmethod
    def from_json(cls, message_id: str, text: str | bytes) -> "MailItem":
        """``message_id``: the field the item is kept under. An item written before the compact form
        starts with its message id (a string), where the compact one starts with its position."""
        fields = orjson.loads(text)
        if isinstance(fields[0], str):
            return cls(*fields)
        return cls(message_id, *fields[1:7], fields[0], *fields[7:])


# The compact item's order after its position: owner .. run_id are always written; attempts .. trace
# are dropped from the end while they hold these defaults.
_ITEM_REQUIRED = 7
_ITEM_DEFAULTS = (None,) * _ITEM_REQUIRED + (0, 0.0, 0.0, 0.0, "", "", False, 0.0, "", 0, False, 0, "")


def _recent(producers: tuple[str, ...], producer_id: str) -> tuple[str, ...]:
    """``producer_id`` moved (or added) to the most recent end, the oldest dropped past MAX_PRODUCERS."""
    if producers and producers[-1] == producer_id:
        return producers
    return (*(p for p in producers if p != producer_id), producer_id)[-MAX_PRODUCERS:]


def _numbered(state: SessionState, sender: str, number: int, inflight: dict[str, int]) -> dict:
    """The pair counters after ``sender``'s message numbered ``number`` landed: its counter moved to the most
    recent end; past MAX_PAIR_COUNTERS the least recent counters of senders with nothing pending are set
    aside into the floor (a pending pair's counter is never set aside: the read receipt reads it)."""
    counters = {k: v for k, v in state.pair_seq.items() if k != sender}
    counters[sender] = max(number, state.pair_seq.get(sender, 0))
    floor = state.pair_seq_floor
    for old in [k for k in counters if k != sender][:max(0, len(counters) - MAX_PAIR_COUNTERS)]:
        if not inflight.get(old):
            floor = max(floor, counters.pop(old))
    return {"pair_seq": counters, "pair_seq_floor": floor}


def _counted(owner: str) -> bool:
    return owner == "agent"


def _observe(state: SessionState, event: ev.MessageEvent) -> dict[str, int]:
    if not _counted(event.owner) or event.run_id is None:
        return state.run_hops
    hops = dict(state.run_hops)
    hops[event.run_id] = max(hops.get(event.run_id, -1), event.agent_hop)
    return hops


def _drain(state: SessionState, event: ev.MessageEvent) -> SessionState:
    """Done mail frees its inbox slot and its pair-window slot."""
    state = replace(state, pending_all=max(0, state.pending_all - 1))
    if not _counted(event.owner):
        return state
    pairs = dict(state.pair_inflight)
    left = pairs.get(event.sender_session_id, 0) - 1
    if left > 0:
        pairs[event.sender_session_id] = left
    else:
        pairs.pop(event.sender_session_id, None)
    return replace(state, pending_agent=max(0, state.pending_agent - 1), pair_inflight=pairs)


def _chained(state: SessionState, event: ev.ProducerMessageAccepted) -> dict:
    """An answer's chain (kept while it is pending) and its sender's loop mark; a message that starts a chain
    answers nothing and leaves neither (``loops.py``)."""
    chain = event.chain_id
    if chain is None:
        return {}
    sender = event.sender_session_id
    mark = loops.next_mark(state.loop_marks.get(sender), chain, event.body)
    return {"loop_marks": loops.remembered(state.loop_marks, sender, mark),
            "chains": {**state.chains, event.message_id: chain}}


def _caused(state: SessionState, event: ev.ProducerMessageConsumed) -> dict:
    """A consumed agent message is what the run's next message is caused by (``loops.cause_of``)."""
    if not _counted(event.owner) or event.run_id is None:
        return {}
    chains = state.chains
    chain = chains.get(event.message_id, event.message_id)
    causes = {k: v for k, v in state.run_causes.items() if k != event.run_id}
    # With tracing, the consume's trace context too: the run's next message continues it (one trace per chain).
    causes[event.run_id] = (event.message_id, chain, event.traceparent) if event.traceparent else \
        (event.message_id, chain)
    while len(causes) > loops.MAX_RUN_CAUSES:
        causes.pop(next(iter(causes)))
    changes: dict = {"run_causes": causes}
    if event.message_id in chains:
        changes["chains"] = {k: v for k, v in chains.items() if k != event.message_id}
    return changes


def evolve(state: SessionState, event: ev.Event) -> SessionState:
    if type(event) in peer_state.FOLDED:  # peer routes and grants: then the cases below, as for any event
        peers = peer_state.evolve(state.peers, event)
        if peers is not state.peers:
            state = replace(state, peers=peers)
    if state.outbox or type(event) in peer_outbox.FOLDED:
        return _evolve_outbox(state, event)
    return _evolve_common(state, event)


def supersede_entry(sender: str | None, key: str) -> str:
    return f"{sender} {key}"


def _unsupersedable(state: SessionState, message_id: str) -> SessionState:
    """Claimed or done: a newer message with its key no longer replaces it."""
    if message_id not in state.superseding.values():
        return state
    return replace(state, superseding={k: v for k, v in state.superseding.items() if v != message_id})


def _evolve_common(state: SessionState, event: ev.Event) -> SessionState:
    if state.superseding and isinstance(event, (ev.ProducerMessageClaimed, ev.ProducerMessageConsumed,
                                                ev.ProducerMessageDiscarded)):
        state = _unsupersedable(state, event.message_id)
    # A match tries its cases in order: the events every send folds come first (each case passed costs an
    # isinstance check, and the sender's MessageSent was fifteenth).
    match event:
        case (ev.ProducerMessageAccepted(owner=owner, sender_session_id=sender)
              | ev.ProducerMessageRestored(owner=owner, sender_session_id=sender)):
            # Settlement notices: a session ever sent mail is "announced" (it owes its parent a settlement notice).
            # One copy of the state for all of it: this case runs for every message sent.
            changes = {"pending_all": state.pending_all + 1, "announced": True, "abort_hold": False}
            producer_id = getattr(event, "producer_id", None)  # a restored message names none
            if producer_id in state.producers:
                changes["producers"] = _recent(state.producers, producer_id)
            if _counted(owner):
                pairs = dict(state.pair_inflight)
                pairs[sender] = pairs.get(sender, 0) + 1
                changes.update(pending_agent=state.pending_agent + 1, pair_inflight=pairs)
                if isinstance(event, ev.ProducerMessageAccepted):
                    changes.update(_chained(state, event))
                    if event.supersede_key:
                        key = supersede_entry(sender, event.supersede_key)
                        changes["superseding"] = {**state.superseding, key: event.message_id}
            elif owner == "loop" and isinstance(event, ev.ProducerMessageAccepted) and event.chain_id:
                changes["loop_notices"] = (*state.loop_notices, event.chain_id)[-loops.MAX_NOTICED:]
            numbered = getattr(event, "pair_seq", None)
            if numbered is not None and sender is not None:
                changes.update(_numbered(state, sender, numbered, changes.get("pair_inflight", state.pair_inflight)))
            return replace(state, **changes)
        # Delivery as an obligation: the sender's own record of its send intents.
        case ev.MessageSent():
            return replace(state, outstanding=state.outstanding + 1)
        case ev.ProducerRegistered(producer_id=producer_id):
            return replace(state, producers=_recent(state.producers, producer_id))
        case ev.SessionRegistered(status=status, continuable=continuable):
            return replace(state, registered=True, status=status, continuable=continuable)
        case ev.SessionStatusChanged(status=status):
            return replace(state, status=status)
        case ev.SessionRunStarted(run_id=run_id):
            return replace(state, status="running", current_run=run_id, wake_pending=False, abort_hold=False,
                           run_seen_at=event.at if leased(run_id) else 0.0)
        case ev.SessionRunRenewed(run_id=run_id) if run_id == state.current_run:
            return replace(state, run_seen_at=event.at)
        case ev.SessionWakeRequested():
            return replace(state, wake_pending=True, wake_requested_at=event.at)
        case ev.SessionRunFinished(run_id=run_id):
            hops = {k: v for k, v in state.run_hops.items() if k != run_id}
            if run_id in state.run_causes:
                state = replace(state, run_causes={k: v for k, v in state.run_causes.items() if k != run_id})
            if state.current_run != run_id:
                return replace(state, run_hops=hops)
            # A session whose run ended is idle until its host says it finished or a new run starts.
            aborted = event.reason == "aborted"
            if aborted and not state.continuable:
                # A one-shot child's abort ends it for good: it is never resumed the way a continuable one is.
                return replace(state, status="finished", current_run=None, run_hops=hops, last_run=run_id,
                               run_seen_at=0.0)
            return replace(state, status="idle", current_run=None, run_hops=hops, last_run=run_id,
                           abort_hold=aborted, run_seen_at=0.0)
        case ev.ProducerMessageConsumed():
            return _drain(replace(state, run_hops=_observe(state, event), **_caused(state, event),
                                  consumed_pace=flow.observe(state.consumed_pace, event.at)), event)
        case ev.ProducerMessageDiscarded():
            if event.message_id in state.chains:
                state = replace(state, chains={k: v for k, v in state.chains.items() if k != event.message_id})
            return _drain(state, event)
        case ev.ProducerMessageAdmitted() | ev.ProducerMessageClaimed():
            return replace(state, run_hops=_observe(state, event))
        case ev.ApprovalRequested():
            entry = ApprovalEntry(event.request_id, event.fingerprint, event.label, "pending")
            return replace(state, approvals={**state.approvals, event.key: entry})
        case ev.ApprovalGranted() | ev.ApprovalDenied() if event.key in state.approvals:
            status = "approved" if isinstance(event, ev.ApprovalGranted) else "denied"
            entry = state.approvals[event.key]._replace(status=status)
            return replace(state, approvals={**state.approvals, event.key: entry})
        case ev.ToolsInstalled(tools=tools):
            return replace(state, installed_tools=tuple(tools))
        case ev.MessageRulesOverlaid(rules=rules):
            return replace(state, rules_overlay=tuple(tuple(rule) for rule in rules))
        case ev.MessageSettled():
            return replace(state, outstanding=max(0, state.outstanding - 1),
                           settled_pace=flow.observe(state.settled_pace, event.at))
        # Disposal, settlement notices, draining.
        case ev.SessionAnnounced():
            return replace(state, announced=True)
        case ev.SessionClosing():
            return replace(state, disposal="closing")
        case ev.SessionClosed():
            return replace(state, disposal="closed")
        case ev.SessionSealed():
            return replace(state, sealed=True)
        case ev.SessionResumed():
            # A new incarnation: open again, idle, and its own end is settled anew.
            return replace(state, disposal=None, status="idle", current_run=None, settled="", settled_notice="",
                           abort_hold=False)
        case ev.ProducerMessageRetried() if state.abort_hold:
            return replace(state, abort_hold=False)  # an explicit retry is a reason to run again
        case ev.SessionSettled():
            return replace(state, settled=settlement_key(event.run_id, event.disposed), settled_notice=event.notice)
        case ev.SessionDrainStarted(by=by):
            return replace(state, drained_by=state.drained_by | {by})
        case ev.SessionDrainLifted(by=by):
            return replace(state, drained_by=state.drained_by - {by})
        case _:
            return state


def _evolve_outbox(state: SessionState, event: ev.Event) -> SessionState:
    """Peer mail as an outbox: an intent counts against the per-source capacity from the moment it is stored
    (with the tree mail the source sent) until it is processed, refused or discarded. Its receipt does not
    count it again; every other event goes on to the common cases."""
    rows = state.outbox
    match event:
        case ev.PeerIntentStored():
            return replace(state, outbox=peer_outbox.evolve(rows, event), outstanding=state.outstanding + 1)
        case ev.PeerAttemptStarted() | ev.PeerAttemptFailed() | ev.PeerDeliveryParked() | ev.PeerDeliveryRetried():
            return replace(state, outbox=peer_outbox.evolve(rows, event))
        case ev.MessageSent() if event.message_id in rows:
            return replace(state, outbox=peer_outbox.accepted(rows, event))
        case ev.MessageRefused() if event.message_id in rows:
            return replace(state, outbox=peer_outbox.without(rows, event.message_id),
                           outstanding=max(0, state.outstanding - 1))
        case ev.MessageSettled() if event.message_id in rows:
            return replace(state, outbox=peer_outbox.without(rows, event.message_id),
                           outstanding=max(0, state.outstanding - 1),
                           settled_pace=flow.observe(state.settled_pace, event.at))
    return _evolve_common(state, event)


def settlement_key(run_id: str | None, disposed: bool) -> str:
    """What one settlement settles: a run's end, or the disposal."""
    return "disposed" if disposed else run_id or ""


def fold(events, state: SessionState = INITIAL) -> SessionState:
    for event in events:
        state = evolve(state, event)
    return state


# The event types whose items ``evolve_mail`` changes, and the others ``apply`` notes; every other known type
# passes through both unread (``events.other_types``): a sender's record would pass a dozen class patterns.
# Every message event is among them, derived rather than listed, so a new one is never passed by unread; and
# a resumption, which makes held mail the new incarnation's.
_MAIL_EVENTS = frozenset({ev.ProducerMessageAccepted, ev.SessionResumed}) | {
    kind for kind in ev.EVENT_TYPES.values() if issubclass(kind, ev.MessageEvent)}
_NOTED_EVENTS = frozenset({ev.SessionWakeRequested, ev.SessionRegistered, ev.ApprovalRequested, ev.ApprovalGranted,
                           ev.ApprovalDenied, ev.SessionInterruptRequested})
_NOT_MAIL = ev.other_types(*_MAIL_EVENTS)
_NOT_NOTED = ev.other_types(*_MAIL_EVENTS, *_NOTED_EVENTS)


def evolve_mail(mail: dict[str, MailItem], event: ev.Event, seq: int) -> dict[str, MailItem]:
    """The pending-mail view after one event at stream position ``seq``; mutates and returns ``mail``."""
    if type(event) in _NOT_MAIL:
        return mail
    match event:
        case ev.ProducerMessageAccepted():
            mail[event.message_id] = MailItem(
                message_id=event.message_id,
                owner=event.owner,
                sender_session_id=event.sender_session_id,
                agent_hop=event.agent_hop,
                mode=event.mode,
                state="accepted",
                run_id=None,
                seq=seq,
                since=event.at,
                trace=event.traceparent or "",
                peer=event.principal is not None,
                reason=NEXT_INCARNATION if event.next_incarnation else "",
                expires_at=event.expires_at or 0.0,
                supersede_key=event.supersede_key or "",
                urgent=event.urgent,
            )
        case ev.ProducerMessageAdmitted() | ev.ProducerMessageClaimed() | ev.ProducerMessageReleased():
            item = mail.get(event.message_id)
            if item is not None:
                new_state = {
                    ev.ProducerMessageAdmitted: "admitted",
                    ev.ProducerMessageClaimed: "claimed",
                    ev.ProducerMessageReleased: "released",
                }[type(event)]
                mail[event.message_id] = _attempt(replace(item, state=new_state, run_id=event.run_id), event)
        case ev.ProducerMessageParked() | ev.ProducerMessageRetried():
            item = mail.get(event.message_id)
            if item is not None:
                mail[event.message_id] = _attempt(item, event)
        case ev.ProducerMessageStranded():
            item = mail.get(event.message_id)
            if item is not None:
                mail[event.message_id] = replace(item, stranded=event.reason)
        case ev.ProducerMessageSteerFellBack():
            # Flow control: queued from here, due at the next run start; the reason is what inspect shows.
            item = mail.get(event.message_id)
            if item is not None:
                mail[event.message_id] = replace(item, state="accepted", mode="queue", run_id=None, retry_at=0.0,
                                                 reason=f"steer_{event.reason}")
        case ev.ProducerMessageConsumed() | ev.ProducerMessageDiscarded():
            mail.pop(event.message_id, None)
        case ev.SessionResumed():
            # The incarnation the held mail waited for has come: from here it is that incarnation's mail like any
            # other, returned if this incarnation is disposed in turn (never held over to yet another one).
            for message_id in held_for_next(mail):
                mail[message_id] = replace(mail[message_id], reason="")
        case ev.ProducerMessageRestored():
            # Consumed on a reverted branch: due again, in its original acceptance order, with a fresh budget of
            # attempts from the restore (its deadline ends it like any other) and its acceptance's expiry.
            mail[event.message_id] = MailItem(
                message_id=event.message_id, owner=event.owner, sender_session_id=event.sender_session_id,
                agent_hop=event.agent_hop, mode=event.mode, state="released", run_id=None, seq=event.accepted_seq,
                since=event.at, expires_at=event.expires_at or 0.0, urgent=event.urgent, peer=event.peer,
            )
        case _:
            pass
    return mail


def held_for_next(mail: dict[str, MailItem]) -> list[str]:
    """The messages waiting for the session's next incarnation (sent while it closed)."""
    return [message_id for message_id, item in mail.items() if item.reason == NEXT_INCARNATION]


def _attempt(item: MailItem, event: ev.MessageEvent) -> MailItem:
    """What a lifecycle step does to the message's delivery attempt record."""
    match event:
        case ev.ProducerMessageClaimed():
            return replace(item, attempts=item.attempts + 1, claimed_at=event.at, retry_at=0.0, shown=item.shown + 1)
        case ev.ProducerMessageReleased():
            # Handed back at a step boundary (not shown): for a steer message, one more boundary passed it over
            # (flow control); for any, the claim did not show it.
            at_boundary = event.reason == "released"
            passed = item.passed + (item.mode == "steer" and at_boundary)
            return replace(item, retry_at=event.retry_at, reason=event.detail or event.reason or "released",
                           attempts=max(0, item.attempts + event.attempts_change), passed=passed,
                           shown=max(0, item.shown - at_boundary))
        case ev.ProducerMessageParked():
            return replace(item, state="parked", reason=event.reason)
        case ev.ProducerMessageRetried():
            # A renewed budget: due at once, in any run, with every attempt and the deadline ahead of it.
            return replace(item, state="released", run_id=None, attempts=0, since=event.at, retry_at=0.0,
                           reason="retried")
    return item


class WakeRequest(NamedTuple):
    """A wake the events request: its event's stream position and the mail it is for (None: a plain wake)."""

    position: int
    message_id: str | None


class InterruptRequest(NamedTuple):
    """An interrupt the events request, at its event's stream position."""

    position: int
    interrupt: "ev.SessionInterruptRequested"


class ApprovalChange(NamedTuple):
    """An approval request's new status, with its request event when the events make it (None otherwise)."""

    request: "ev.ApprovalRequested | None"
    status: str


@dataclass(frozen=True)
class Applied:
    """What appending some events leaves, besides the events themselves: folded once, here.

    The event store writes exactly this (snapshot, mail items, wake triggers,
    indexes) in the same atomic step as the events; it decides nothing.
    """

    state: SessionState
    version: int
    # message id -> its item after the events, or None once it is done.
    mail_changes: dict[str, MailItem | None]
    # Each wake requested, where on the stream.
    wakes: list["WakeRequest"]
    # A handle the registration reserves in its tree (unique per tree).
    handle: str | None
    # Approval requests changed, by request id.
    approvals: dict[str, "ApprovalChange"]
    # Relationship labels granted for the whole tree.
    tree_grants: list[str]
    # interrupt_agent: each interrupt requested, where on the stream; its trigger rides the wake stream.
    interrupts: list["InterruptRequest"] = field(default_factory=list)
    # The events register the session: it joins its tree and partition (with or without a handle).
    registers: bool = False


def apply(state: SessionState, mail: dict[str, MailItem], events: list[ev.Event], version: int,
          folded: SessionState | None = None) -> Applied:
    """Fold ``events``, appended after position ``version``, into everything kept beside the stream.

    ``folded``: the state ``events`` leave, when the decision already folded them from ``state``
    (``wake.with_wake_folded``); the same ``fold``, so it is not done twice."""
    mail = dict(mail)
    touched: list[str] = []
    wakes: list[WakeRequest] = []
    handle = None
    registers = False
    approvals: dict[str, ApprovalChange] = {}
    grants: list[str] = []
    interrupts: list[InterruptRequest] = []
    for seq, event in enumerate(events, start=version + 1):
        if folded is None:
            state = evolve(state, event)
        if isinstance(event, ev.SessionResumed):
            touched.extend(held_for_next(mail))  # each held item becomes the new incarnation's: written again
        mail = evolve_mail(mail, event, seq)
        if type(event) in _NOT_NOTED:
            continue
        match event:
            case ev.ProducerMessageAccepted() | ev.MessageEvent():
                touched.append(event.message_id)
            case ev.SessionWakeRequested():
                wakes.append(WakeRequest(seq, event.message_id))
            case ev.SessionRegistered():
                handle, registers = event.handle, True
            case ev.ApprovalRequested():
                approvals[event.request_id] = ApprovalChange(event, "pending")
            case ev.ApprovalGranted():
                approvals[event.request_id] = ApprovalChange(None, "approved")
                if event.scope == "tree":
                    grants.append(event.label)
            case ev.ApprovalDenied():
                approvals[event.request_id] = ApprovalChange(None, "denied")
            case ev.SessionInterruptRequested():
                interrupts.append(InterruptRequest(seq, event))
    changes = {message_id: mail.get(message_id) for message_id in dict.fromkeys(touched)}
    return Applied(folded or state, version + len(events), changes, wakes, handle, approvals, grants, interrupts=interrupts,
                   registers=registers)
