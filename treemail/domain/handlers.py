"""Routing as data: every command type and the pure function that decides it.

Adding a command is one row here. ``reads_mail`` says which of the session's
pending mail the decision needs: ``"all"`` of it, the ``"due"`` index (what a
claim may take), the one item the command ``"named"``, or none (``""``). The
per-message commands read one item, so their cost does not grow with a backlog.
The send is decided by the worker pool on what it loads in bulk
(``SendGiven``); every other command by the session service on ``Given``.
"""

from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

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


@dataclass(frozen=True)
class Handler:
    decide: Callable
    reads_mail: Literal["", "all", "due", "named"] = ""


HANDLERS: dict[type, Handler] = {
    c.SendMessage: Handler(decide_send),
    c.RegisterSession: Handler(decide_register),
    c.ChangeStatus: Handler(decide_status),
    c.StartRun: Handler(decide_start_run, reads_mail="all"),
    c.FinishRun: Handler(decide_finish_run, reads_mail="all"),
    c.ClaimMail: Handler(decide_claim, reads_mail="due"),
    c.ConsumeMail: Handler(decide_consume, reads_mail="named"),
    c.ReleaseMail: Handler(decide_release, reads_mail="named"),
    c.DiscardMail: Handler(decide_discard, reads_mail="named"),
    c.InjectMail: Handler(decide_inject),
    c.RequestWake: Handler(decide_request_wake),
    c.ResolveApproval: Handler(decide_resolve_approval),
}
