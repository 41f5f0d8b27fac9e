"""``tm.tools.mailbox``: what an agent with no engine behind it needs to receive: a turn's claim, a bounded wait for
mail, and a look at what is waiting that claims nothing.

An MCP-only agent (``producers/mcp/connection.py``) runs for as long as its
connection: each of its mail checks is a new turn of its model, so queued mail
is due there too (``ClaimTurn``). Waiting blocks on the session's own stream
(``XREAD BLOCK`` from the position read before the claim came back empty), so
nothing appended in between is missed and nobody polls.
"""

from treemail.domain import commands as c
from treemail.domain.decide.delivery import WAITING, renewal_due

from .delivery import Deliveries
from .shared import Part, Shared
from .types import Delivery


class Mailbox(Part):
    def __init__(self, shared: Shared, deliveries: Deliveries) -> None:
        super().__init__(shared)
        # How long a claim may go unacknowledged before treemail releases it (``attempt_timeout_s``).
        self.claim_timeout_s = shared.config.messaging.attempt_timeout_s
        self._deliveries = deliveries

    async def current_run(self, session_id: str) -> str | None:
        """The session's open run, None when none is."""
        return (await self._reader.state_of(session_id)).current_run

    async def renewed_run(self, session_id: str) -> str | None:
        """The session's open run, as ``current_run``; a call of a leased run's agent (over HTTP) is recorded
        when due, so the pump never finishes the run of an agent that still calls (``mcp_idle_s``). Raises
        ``lifecycle:not_current_run`` if the pump finished it first."""
        record = await self._reader.record(session_id)
        state = await self._reader.state(record)
        if renewal_due(state, self._config.messaging, self._clock.now()):
            await self._sessions.execute(c.RenewRun(session_id, state.current_run), record)
        return state.current_run

    async def end_connection(self, session_id: str, run_id: str) -> None:
        """The connection that ran the session is gone (closed, or killed and taken over): its run ends as cut
        short, not failed by its mail, so what it had claimed and not confirmed is due again at once, for the
        next connection, with its attempt counted."""
        await self._sessions.execute(c.FinishRun(session_id, run_id, interrupted=True))

    async def position(self, session_id: str) -> int:
        return await self._reader.version(session_id)

    async def claim_turn(self, session_id: str, run_id: str) -> list[Delivery]:
        """A new turn of ``run_id``: every pending message due now (queued mail included), claimed by it."""
        return await self._deliveries.claim(session_id, run_id, turn=True)

    async def claimed_by(self, session_id: str, run_id: str) -> list[str]:
        """The messages ``run_id`` holds claimed now, in acceptance order: what its last results showed."""
        mail = await self._reader.mail(await self._reader.record(session_id))
        return [m.message_id for m in sorted(mail.values(), key=lambda m: m.seq)
                if m.state == "claimed" and m.run_id == run_id]

    async def waiting(self, session_id: str) -> list[dict]:
        """What waits for the session, unclaimed (message id, owner, mode, sender, state): never the bodies,
        which only a claim hands out, so looking never delivers a message outside its lifecycle."""
        mail = await self._reader.mail(await self._reader.record(session_id))
        return [
            {"message_id": m.message_id, "owner": m.owner, "mode": m.mode, "sender_session_id": m.sender_session_id,
             "state": m.state}
            for m in sorted(mail.values(), key=lambda m: m.seq) if m.state in WAITING
        ]

    async def wait_for_change(self, session_id: str, after: int, timeout_s: float) -> bool:
        """Block until the session's stream holds an event past position ``after`` (True), or ``timeout_s``
        passes (False)."""
        return await self._reader.wait_for_change(await self._reader.record(session_id), after, timeout_s)
