"""A leased run's life (an agent over streamable HTTP, ``domain/leasedruns.py``): renewed by its agent's calls,
finished by the pump once they stop.

HTTP never says that a client went away, so without this a vanished agent's session would stay running for
ever: mail to it answered ``running``, steer mail waiting for a call that never comes, no wake for a host to
act on. Finished for idleness, the run ends as one cut short (its unconfirmed claims are due again at once,
each a counted attempt), mail waits with a wake, and the agent's next call opens a new run.
"""

from dataclasses import replace

from .. import events as ev
from ..commands import FinishRun, KeepObligations, RenewRun
from ..errors import LifecycleError
from ..leasedruns import leased
from ..state import fold
from .delivery import idle_at, renewal_due
from .lifecycle import Given, decide_finish_run, require_current_run, require_registered
from .obligations import decide_keep
from .wake import mail_after

# The reason its ``SessionRunFinished`` records: the agent made no call for ``mcp_idle_s``.
IDLE = "idle"


def decide_renew_run(command: RenewRun, given: Given) -> list[ev.Event]:
    """Recorded only when due (``renewal_due``): two requests of one agent renew once."""
    require_registered(given.state)
    require_current_run(given.state, command.run_id)
    if not leased(command.run_id):
        raise LifecycleError("lifecycle:not_leased", f"run {command.run_id} is not held by a lease")
    if not renewal_due(given.state, given.config, given.now):
        return []
    return [ev.SessionRunRenewed(at=given.now, run_id=command.run_id)]


def decide_keep_with_idle(command: KeepObligations, given: Given) -> list[ev.Event]:
    """The pump's look at a session (``obligations.decide_keep``), then its leased run finished if its agent
    made no call for ``mcp_idle_s``: as a connection's end, so what it held claimed is due again at once."""
    events = decide_keep(command, given)
    state = fold(events, given.state) if events else given.state
    when = idle_at(state, given.config)
    if when is None or when > given.now:
        return events
    after = replace(given, state=state, mail=mail_after(given.mail, events))
    finish = FinishRun(command.session_id, state.current_run, reason=IDLE, interrupted=True)
    return [*events, *decide_finish_run(finish, after)]
