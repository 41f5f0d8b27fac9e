"""Routing as data: every command type and the pure function that decides it.

Adding a command is one row here. ``reads_mail`` says whether the decision
needs the session's pending mail (loading it costs a read the others skip).
The send is decided by the worker pool on what it loads in bulk
(``SendGiven``); every other command by the session service on ``Given``.
"""

from collections.abc import Callable
from dataclasses import dataclass

from . import commands as c
from .decide.approvals import decide_resolve_approval
from .decide.lifecycle import (
    decide_claim,
    decide_consume,
    decide_discard,
    decide_finish_run,
    decide_inject,
    decide_register,
    decide_release,
    decide_request_wake,
    decide_start_run,
    decide_status,
)
from .decide.send import decide_send
from .decide.disposal import decide_close, decide_dispose, decide_drain, decide_lift_drain, decide_return_mail
from .decide.settlement import decide_settle


@dataclass(frozen=True)
class Handler:
    decide: Callable
    reads_mail: bool = False


HANDLERS: dict[type, Handler] = {
    c.SendMessage: Handler(decide_send),
    c.RegisterSession: Handler(decide_register),
    c.ChangeStatus: Handler(decide_status),
    c.StartRun: Handler(decide_start_run, reads_mail=True),
    c.FinishRun: Handler(decide_finish_run, reads_mail=True),
    c.ClaimMail: Handler(decide_claim, reads_mail=True),
    c.ConsumeMail: Handler(decide_consume, reads_mail=True),
    c.ReleaseMail: Handler(decide_release, reads_mail=True),
    c.DiscardMail: Handler(decide_discard, reads_mail=True),
    c.InjectMail: Handler(decide_inject),
    c.RequestWake: Handler(decide_request_wake),
    c.ResolveApproval: Handler(decide_resolve_approval),
    # Seed 002, part 1: disposal, settlement notices, draining. SettleSession is decided on
    # the child and its parent together (``SettlementGiven``), by ``services.settlement``.
    c.DisposeSession: Handler(decide_dispose, reads_mail=True),
    c.ReturnMail: Handler(decide_return_mail),
    c.CloseSession: Handler(decide_close, reads_mail=True),
    c.SettleSession: Handler(decide_settle),
    c.DrainSession: Handler(decide_drain),
    c.LiftDrain: Handler(decide_lift_drain),
}
