"""An agent that receives over streamable HTTP (``treemail mcp --http --receive``): no connection, a lease.

Over HTTP no connection lives as long as the agent, and consecutive requests
of one agent may land on different server processes. So nothing here is kept
in a process: every request rebuilds what it needs from the session's stream.

- the session's run: one run of the session (``mcp-http:<id>``), opened by the
  first receiving request and found again by every later one, whichever
  process serves it (the session's ``current_run``);
- what the last result showed: the messages that run holds claimed; each
  request confirms (consumes) the ones held when it arrived, since the agent
  made another call, so its model read the result that carried them;
- the lease: a claim of that run lasts ``[messaging] mcp_lease_s`` (60 s). One
  that no call confirmed by then (the client vanished, or its model thought for
  longer) is released by the pump as a failed attempt, exactly as an engine's
  claim at its attempt timeout (``decide/obligations.py``): counted, due again
  after its backoff, and shown again marked ``shown_before``.

- the run's life: HTTP says nothing when a client goes away, so the run lasts
  while its agent calls. A call is recorded on the run (``SessionRunRenewed``,
  at most one per tenth of ``[messaging] mcp_idle_s``); a run with no call for
  ``mcp_idle_s`` (600 s) is finished by the pump, as a connection's end, and
  the agent's next call opens a new one.

A stdio connection of the session takes the run over, or the host finishes
it. A session an engine runs is never taken over (``mcp:engine_run``).
"""

import asyncio

from treemail.domain import ids
from treemail.domain.leasedruns import LEASED_RUN_PREFIX, leased
from treemail.domain.errors import LifecycleError

from ..host.facade import Treemail
from ..tools import receiving
from .connection import RUN_PREFIX, ConnectionRefused, inbox_of, marked, take_turn, watch_inbox

# Why a claim is handed back when its request was cancelled (what ``inspect`` shows as its latest reason).
ANSWER_NOT_DELIVERED = "the client went away before the answer carrying it"

# A wait holds the request open: past about 30 s, HTTP clients' and proxies' own read timeouts cut it, and
# a response that never arrives leaves its claim to the lease. So a wait over HTTP ends by 25 s at most.
MAX_HTTP_WAIT_S = 25.0


def http_wait_s(requested_s: float) -> float:
    """How long a wait_for_mail over HTTP holds its request: what the client asked, within the bound."""
    return min(requested_s, MAX_HTTP_WAIT_S)


async def leased_run(host: Treemail, session_id: str) -> str:
    """The session's leased run, opened if none is (a stdio connection's run is taken over, the newer wins)."""
    mailbox = host.tools.mailbox
    for _ in range(5):  # another process may be opening it at the same moment
        try:
            current = await mailbox.renewed_run(session_id)
        except LifecycleError as error:
            if error.code != "lifecycle:not_current_run":
                raise
            continue  # the pump finished it for idleness at this moment: open a new one
        if leased(current):
            return current
        if current is not None and not current.startswith(RUN_PREFIX):
            raise ConnectionRefused(
                "mcp:engine_run", f"session {session_id} is run by its engine (run {current}); "
                "MCP over HTTP receives only for a session no engine runs")
        if current is not None:
            try:
                await mailbox.end_connection(session_id, current)
            except LifecycleError:
                continue
        run_id = f"{LEASED_RUN_PREFIX}{ids.uuid7()}"
        try:
            await host.start_run(session_id, run_id)
            return run_id
        except LifecycleError as error:
            if error.code != "lifecycle:run_active":
                raise
    raise ConnectionRefused("mcp:connection_race", "another request keeps opening this session's run; retry")


class LeasedSession:
    """What one HTTP request of a receiving agent does; built per request, it keeps nothing between them."""

    def __init__(self, host: Treemail, session_id: str) -> None:
        self.host = host
        self.session_id = session_id
        self.threads = False

    async def _confirm(self, run_id: str) -> int:
        """The agent made another call: what the run held claimed when it arrived was read."""
        confirmed = 0
        for message_id in await self.host.tools.mailbox.claimed_by(self.session_id, run_id):
            try:
                await self.host.consume(self.session_id, message_id)
                confirmed += 1
            except LifecycleError:
                pass  # its lease ended first (released, it comes back marked) or another request confirmed it
        return confirmed

    async def _unless_gone(self, run_id: str, claiming):
        """``claiming``, this request's claim. A request cancelled meanwhile (its client went away before the
        answer) hands back what the run holds claimed before the cancellation goes on: no answer carried it, so
        the agent's next call must not confirm it. It is shown by a later call as news, never counted as seen."""
        try:
            return await claiming
        except asyncio.CancelledError:
            await asyncio.shield(self._hand_back(run_id))
            raise

    async def _hand_back(self, run_id: str) -> None:
        for message_id in await self.host.tools.mailbox.claimed_by(self.session_id, run_id):
            try:
                await self.host.release(self.session_id, message_id, ANSWER_NOT_DELIVERED)
            except LifecycleError:
                pass  # released or confirmed meanwhile

    async def _run(self) -> str | dict:
        """The session's leased run, or the refusal the model reads (an engine runs it, or it cannot run now:
        disposed or being disposed, say)."""
        try:
            return await leased_run(self.host, self.session_id)
        except (ConnectionRefused, LifecycleError) as refused:
            return receiving.error(refused.code, refused.message)

    async def step(self, call):
        """Around any other tool call: confirm, call, then the steer mail due now rides on its result."""
        run_id = await self._run()
        if isinstance(run_id, dict):
            return run_id, []
        await self._confirm(run_id)
        result = await call(run_id)
        if result is None:
            return None, []
        try:
            due = await self._unless_gone(run_id, self.host.claim(self.session_id, run_id))
        except LifecycleError:
            due = []  # the run ended in between (taken over or finished): the mail stays for the next request
        return result, marked(due)

    async def receive(self, name: str, arguments) -> dict:
        """``check_mail``, ``wait_for_mail`` (at most ``MAX_HTTP_WAIT_S``) or ``acknowledge_mail``."""
        wait_s = receiving.parse(name, arguments)
        if isinstance(wait_s, dict):
            return wait_s
        run_id = await self._run()
        if isinstance(run_id, dict):
            return run_id
        confirmed = await self._confirm(run_id)
        if name == receiving.ACKNOWLEDGE_MAIL:
            return {"acknowledged": confirmed}
        definition = await self.host.tool_definition(self.session_id)
        self.threads = definition is not None and "in_reply_to" in definition["input_schema"]["properties"]
        try:
            taken = await self._unless_gone(
                run_id, take_turn(self.host.tools.mailbox, self.session_id, run_id, http_wait_s(wait_s)))
        except LifecycleError as error:
            if error.code != "lifecycle:not_current_run":
                raise
            return receiving.error("mcp:superseded", "another connection of this session took over; call again")
        return receiving.mail_result(marked(taken))

    async def inbox(self) -> dict:
        return await inbox_of(self.host.tools.mailbox, self.session_id)

    def watch(self, notify) -> asyncio.Task:
        """Call ``notify()`` whenever mail becomes due, until the returned task is cancelled (the listen stream
        that asked ends)."""
        return asyncio.create_task(watch_inbox(self.host.tools.mailbox, self.session_id, notify))
