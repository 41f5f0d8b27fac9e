"""An MCP connection that is the agent: its session runs while it is connected, and it receives mail.

For an agent that speaks only MCP there is no engine to start runs and claim
mail at model-request boundaries, so the connection does it:

- connected = running: opening the connection starts a run of its own
  (``mcp-conn:<id>``); the connection's calls are made from that run, so once a
  newer connection of the same session took over, an older one can no longer
  send (exact live sender: ``sender_not_live``);
- each tool call is a step boundary: the mail the previous call handed to the
  model is consumed first (the agent made another call, so its model read
  that result), then due steer mail rides on the call's result;
  ``check_mail``/``wait_for_mail`` are a new turn (queued mail too);
- gone = idle: closing finishes the run, which releases whatever was claimed
  and not yet confirmed (it is due again on the next connection, never lost and
  never delivered twice into one context), and leaves mail queued with a wake
  for whoever starts the agent again.

A connection whose process died without closing leaves its run open: the next
connection of the session finishes it (releasing its claims) before starting
its own; a run an engine started is never taken over (``mcp:engine_run``).
"""

import asyncio
import contextlib
from dataclasses import replace

from treemail.domain import envelope, ids
from treemail.domain.decide.delivery import leased
from treemail.domain.errors import InvalidRequest, LifecycleError

from ..host.facade import Treemail
from ..host.types import Delivery
from ..tools import receiving

RUN_PREFIX = "mcp-conn:"
INBOX_URI = "treemail://inbox"
# An agent may think for minutes before its next call, longer than a claim may stay unacknowledged
# (``attempt_timeout_s``): its connection, still open, confirms the claims itself at this fraction of that
# timeout, since a client that is still connected has the result. Otherwise treemail would release them
# as a failed attempt and hand them to the same model a second time.
KEEP_AT = 0.8


class ConnectionRefused(InvalidRequest):
    """The connection cannot be the agent (a user error: the CLI says it in one line)."""


class Connection:
    def __init__(self, host: Treemail, session_id: str) -> None:
        self.host = host
        self.session_id = session_id
        self.run_id = f"{RUN_PREFIX}{ids.uuid7()}"
        self._outstanding: list[str] = []
        # One call at a time: a confirmation must follow the result it confirms.
        self._lock = asyncio.Lock()
        self._watchers: set[asyncio.Task] = set()
        # Threads on (send_message takes in_reply_to): the model needs each message's id to answer it.
        self.threads = False
        self._keeper: asyncio.TimerHandle | None = None

    async def open(self) -> None:
        mailbox = self.host.tools.mailbox
        definition = await self.host.tool_definition(self.session_id)
        self.threads = definition is not None and "in_reply_to" in definition["input_schema"]["properties"]
        for _ in range(5):  # another connection of the session may be opening at the same moment
            current = await mailbox.current_run(self.session_id)
            # Another agent connection's run (stdio, or the lease-held run over HTTP) is taken over; an engine's never.
            if current is not None and not (current.startswith(RUN_PREFIX) or leased(current)):
                raise ConnectionRefused(
                    "mcp:engine_run", f"session {self.session_id} is run by its engine (run {current}); "
                    "an MCP connection receives only for a session no engine runs")
            if current is not None:
                # A connection that went away without closing (killed): its claims are released by this finish.
                with contextlib.suppress(LifecycleError):
                    await mailbox.end_connection(self.session_id, current)
            try:
                await self.host.start_run(self.session_id, self.run_id)
                return
            except LifecycleError as error:
                if error.code != "lifecycle:run_active":
                    raise
        raise ConnectionRefused("mcp:connection_race", "another connection of this session keeps opening; retry")

    async def close(self) -> None:
        if self._keeper is not None:
            self._keeper.cancel()
        for task in self._watchers:
            task.cancel()
        with contextlib.suppress(LifecycleError):
            # Releases what was claimed and never confirmed; the session is idle until it is connected again.
            await self.host.tools.mailbox.end_connection(self.session_id, self.run_id)

    # ---- step boundaries ----------------------------------------------------------------------------

    async def _confirm(self) -> int:
        """The model read the previous result: consume what it carried."""
        confirmed = 0
        for message_id in self._outstanding:
            try:
                await self.host.consume(self.session_id, message_id)
                confirmed += 1
            except LifecycleError:
                # Its claim expired or its run ended first: it was released, and comes back once more.
                pass
        self._outstanding = []
        return confirmed

    def _hand_out(self, deliveries: list[Delivery]) -> list[Delivery]:
        """What a result hands to the model (repeats marked), held until a later call confirms it."""
        deliveries = marked(deliveries)
        self._outstanding = handed = [d.message_id for d in deliveries]
        if self._keeper is not None:
            self._keeper.cancel()
            self._keeper = None
        if handed:
            loop = asyncio.get_running_loop()
            self._keeper = loop.call_later(KEEP_AT * self.host.tools.mailbox.claim_timeout_s,
                                           lambda: self._watch_task(self.keep(handed)))
        return deliveries

    def _watch_task(self, coroutine) -> None:
        task = asyncio.create_task(coroutine)
        self._watchers.add(task)
        task.add_done_callback(self._watchers.discard)

    async def keep(self, handed: list[str]) -> int:
        """The connection is still open with ``handed`` unconfirmed: confirm them before their claims expire."""
        async with self._lock:
            if self._outstanding != handed:
                return 0  # a call confirmed them already
            return await self._confirm()

    async def step(self, call):
        """Around any other tool call: confirm, call, then the steer mail due now rides on its result."""
        async with self._lock:
            await self._confirm()
            result = await call(self.run_id)
            if result is None:  # an unknown tool: the caller raises, so nothing may ride on this result
                return None, []
            try:
                due = await self.host.claim(self.session_id, self.run_id)
            except LifecycleError:
                due = []  # superseded: this connection's run is over, the call's own result says so
            return result, self._hand_out(due)

    async def receive(self, name: str, arguments) -> dict:
        """``check_mail``, ``wait_for_mail`` or ``acknowledge_mail``."""
        wait_s = receiving.parse(name, arguments)
        if isinstance(wait_s, dict):
            return wait_s
        async with self._lock:
            confirmed = await self._confirm()
            if name == receiving.ACKNOWLEDGE_MAIL:
                return {"acknowledged": confirmed}
            try:
                return receiving.mail_result(self._hand_out(await self._take(wait_s)))
            except LifecycleError as error:
                if error.code != "lifecycle:not_current_run":
                    raise
                return receiving.error(
                    "mcp:superseded", "a newer connection of this session took over; this one receives no more")

    async def _take(self, wait_s: float) -> list[Delivery]:
        return await take_turn(self.host.tools.mailbox, self.session_id, self.run_id, wait_s)

    # ---- the inbox resource ---------------------------------------------------------------------------

    async def inbox(self) -> dict:
        return await inbox_of(self.host.tools.mailbox, self.session_id)

    def watch(self, notify) -> asyncio.Task:
        """Call ``notify()`` whenever mail becomes due, until the returned task is cancelled."""
        task = asyncio.create_task(watch_inbox(self.host.tools.mailbox, self.session_id, notify))
        self._watchers.add(task)
        task.add_done_callback(self._watchers.discard)
        return task


# ---- what a connection and a leased HTTP session share ---------------------------------------------


def marked(deliveries: list[Delivery]) -> list[Delivery]:
    """What a result hands to the model, each repeat marked in its envelope (``shown_before``): a message an
    earlier result showed and nothing confirmed comes back, and a resumed model must tell it from news."""
    return [replace(d, text=envelope.mark_shown_before(d.text, d.shown_before)) for d in deliveries]


async def take_turn(mailbox, session_id: str, run_id: str, wait_s: float) -> list[Delivery]:
    """A new turn of ``run_id``: the mail due now, or the first that becomes due within ``wait_s``."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + wait_s
    while True:
        # The position before the claim: whatever lands after an empty claim wakes the wait below.
        position = await mailbox.position(session_id)
        taken = await mailbox.claim_turn(session_id, run_id)
        left = deadline - loop.time()
        if taken or left <= 0:
            return taken
        if not await mailbox.wait_for_change(session_id, position, left):
            return []


async def inbox_of(mailbox, session_id: str) -> dict:
    """What waits, unclaimed (no bodies: reading the resource delivers nothing)."""
    waiting = await mailbox.waiting(session_id)
    return {"session_id": session_id, "waiting": len(waiting), "messages": waiting}


async def watch_inbox(mailbox, session_id: str, notify) -> None:
    told: set[str] = set()
    while True:
        position = await mailbox.position(session_id)
        waiting = {m["message_id"] for m in await mailbox.waiting(session_id)}
        if waiting - told:
            await notify()
        told = waiting
        await mailbox.wait_for_change(session_id, position, 30.0)
