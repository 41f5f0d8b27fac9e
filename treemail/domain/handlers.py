"""Routing as data: every command type and the pure function that decides it.

Adding a command is one row here. ``reads_mail`` says which of the session's
pending mail the decision needs: ``"all"`` of it, the ``"due"`` index (what a
claim may take), the one item the command ``"named"``, or none (``""``). The
per-message commands read one item, so their cost does not grow with a backlog.
``reads_history`` names the stream whose events it needs (revert and fork).
``reads_senders`` names the senders whose streams the decision writes on
(a settlement or a restoration is recorded by its sender, in the same
atomic step, so a source's count of unsettled intents stays exact).
The send is decided by the worker pool on what it loads in bulk
(``SendGiven``); every other command by the session service on ``Given``,
through ``decide_command``, which returns every event of the decision.
"""

from collections.abc import Callable
from dataclasses import dataclass
from operator import attrgetter
from typing import Literal

from . import commands as c
from . import events as ev
from . import outbound
from .decide.approvals import decide_resolve_approval
from .decide.branches import decide_fork, decide_revert, restored_senders
from .decide.lifecycle import (
    Given,
    decide_announce,
    decide_claim,
    decide_claim_turn,
    decide_consume,
    decide_discard,
    decide_finish_run,
    decide_inject,
    decide_register,
    held_parent,
    registration_parent,
    decide_release,
    decide_request_wake,
    decide_start_run,
    decide_status,
)
from .decide import peerdelivery
from .decide.mailcontrol import decide_cancel, decide_cancel_peer, expiring_senders
from .decide.interrupt import decide_interrupt
from .decide.rules import decide_overlay_rules
from .decide.obligations import decide_retry
from .decide.leasedruns import decide_keep_with_idle, decide_renew_run
from .decide.tools import decide_install_tools
from .decide.routes import decide_peer_send, decide_register_route, decide_revoke_route, decide_set_grant
from .decide.send import decide_send
from .decide.disposal import (decide_close, decide_dispose, decide_drain, decide_lift_drain, decide_return_mail,
                              decide_seal)
from .decide.settlement import decide_settle, settlement_elsewhere, settlement_parent
from .decide import subtree


def close_reads(command, mail, history=()) -> set[str]:
    """A close settles its pending agent mail with each sender, and the disposal with the parent."""
    return outbound.mail_senders(command, mail, history) | settlement_parent(command)


@dataclass(frozen=True)
class Handler:
    decide: Callable
    reads_mail: Literal["", "all", "due", "named"] = ""
    # The session whose whole stream the decision reads (``Given.history``), from the command; None: none.
    reads_history: Callable | None = None
    # The senders whose records the decision writes (``Given.senders``), from the command, the mail and the
    # history it read; None: none.
    reads_senders: Callable | None = None
    # Events the decision writes on other streams it read (``reads_senders``) besides the senders' records:
    # (command, given, its events) -> session id -> events. A settlement notice on the parent's stream.
    elsewhere: Callable | None = None


HANDLERS: dict[type, Handler] = {
    c.SendMessage: Handler(decide_send),
    c.RegisterSession: Handler(decide_register, reads_senders=registration_parent, elsewhere=held_parent),
    # Reads all mail (delivery as an obligation): going idle wakes only for mail deliverable now
    # (not parked, not backing off).
    c.ChangeStatus: Handler(decide_status, reads_mail="all"),
    c.StartRun: Handler(decide_start_run, reads_mail="all"),
    # A settling finish writes its parent's notice in the same step.
    c.FinishRun: Handler(decide_finish_run, reads_mail="all", reads_senders=settlement_parent,
                         elsewhere=settlement_elsewhere),
    c.RenewRun: Handler(decide_renew_run),
    c.ClaimMail: Handler(decide_claim, reads_mail="due"),
    # Queued mail is not in the due index (it waits for a new run), so a turn reads all pending mail.
    c.ClaimTurn: Handler(decide_claim_turn, reads_mail="all"),
    # Consumption and discard settle the message: its sender records it.
    c.ConsumeMail: Handler(decide_consume, reads_mail="named", reads_senders=outbound.mail_senders),
    c.ReleaseMail: Handler(decide_release, reads_mail="named"),
    c.DiscardMail: Handler(decide_discard, reads_mail="named", reads_senders=outbound.mail_senders),
    c.InjectMail: Handler(decide_inject),
    c.RequestWake: Handler(decide_request_wake),
    c.ResolveApproval: Handler(decide_resolve_approval),
    # interrupt_agent (decided like the send, on what ``services.interrupts`` loads)
    c.InterruptAgent: Handler(decide_interrupt),
    # Revert and fork: decided on the session's own history, or on the fork source's. Restored mail is
    # unsettled again: its sender counts it again.
    c.RevertSession: Handler(decide_revert, reads_mail="all", reads_history=attrgetter("session_id"),
                             reads_senders=restored_senders),
    c.ForkSession: Handler(decide_fork, reads_history=attrgetter("source_session_id"),
                           reads_senders=registration_parent, elsewhere=held_parent),
    # effective permissions: the session overlay
    c.OverlayMessageRules: Handler(decide_overlay_rules),
    # Delivery as an obligation.
    # Expiry: an expired message is settled with its sender, in the pump's same step.
    # A leased run (an agent over HTTP) whose agent stopped calling is finished by the pump's same look.
    c.KeepObligations: Handler(decide_keep_with_idle, reads_mail="all", reads_senders=expiring_senders),
    c.RetryMail: Handler(decide_retry, reads_mail="all"),
    # Peer routes and grants (on the target's stream); a peer send is decided like the
    # interrupt, on what ``services.peers`` loads, by the send's own guards
    c.RegisterPeerRoute: Handler(decide_register_route),
    c.RevokePeerRoute: Handler(decide_revoke_route),
    c.SetPeerGrant: Handler(decide_set_grant),
    c.SendToPeer: Handler(decide_peer_send),
    # Peer mail as an outbox: a driver's steps on the source's stream (the admission itself is decided by
    # ``services.peerdelivery`` on the destination's, with ``peerdelivery.decide_admission``).
    c.DrivePeerDelivery: Handler(peerdelivery.decide_drive),
    c.RecordPeerAdmission: Handler(peerdelivery.decide_record_admission),
    c.SettlePeerDelivery: Handler(peerdelivery.decide_settle_peer),
    c.RetryPeerDelivery: Handler(peerdelivery.decide_retry_peer),
    c.DiscardPeerDelivery: Handler(peerdelivery.decide_discard_peer),
    # Disposal, settlement notices, draining. SettleSession is decided on
    # the child and its parent together (``SettlementGiven``), by ``services.settlement``.
    c.DisposeSession: Handler(decide_dispose, reads_mail="all"),
    c.ReturnMail: Handler(decide_return_mail),
    # Closing sets every pending message aside: each agent message's sender records its settlement.
    c.CloseSession: Handler(decide_close, reads_mail="all", reads_senders=close_reads,
                            elsewhere=settlement_elsewhere),
    c.SettleSession: Handler(decide_settle),
    # The announced gate, said directly by a host that gave a child its task outside treemail.
    c.AnnounceSession: Handler(decide_announce),
    c.DrainSession: Handler(decide_drain),
    c.SealSession: Handler(decide_seal),
    c.LiftDrain: Handler(decide_lift_drain),
    # Tools installed one by one.
    c.InstallTools: Handler(decide_install_tools),
    # Whole subtrees: each recorded once (under its own key) on the stream it starts from; the copies of a
    # broadcast are ordinary sends, a cascading stop's steps are interrupts and disposals.
    c.BroadcastToSubtree: Handler(subtree.decide_broadcast),
    c.RecordBroadcastDelivery: Handler(subtree.decide_broadcast_delivery),
    c.StopSubtree: Handler(subtree.decide_stop_subtree),
    c.InterruptRun: Handler(subtree.decide_interrupt_run),
    # Cancel: decided where claims are, so the two are ordered; a cancelled message's sender records it.
    c.CancelMail: Handler(decide_cancel, reads_mail="named", reads_senders=outbound.mail_senders),
    c.CancelPeerDelivery: Handler(decide_cancel_peer),
}


@dataclass(frozen=True)
class Decision:
    """Every event of one session command: those on its own stream, and each sender's records of them."""

    events: list[ev.Event]
    sources: list[outbound.Source]


def decide_command(command: c.SessionCommand, given: Given) -> Decision:
    """Decide ``command`` with its row of the table; the senders' records come from the same events."""
    handler = HANDLERS[type(command)]
    events = handler.decide(command, given)
    elsewhere = handler.elsewhere(command, given, events) if handler.elsewhere else {}
    return Decision(events, outbound.sources(given.session_id, given.state.status, events, given.version,
                                             given.senders, outbound.peer_mail(given.mail), elsewhere))
