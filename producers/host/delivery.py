"""The claimed mail's lifecycle: claimed into a run (read tolerantly, each source proof checked, rendered),
consumed, released or discarded.

A message whose proof fails is discarded (never delivered; the history keeps
the entry and why) and counted. An entry a newer protocol wrote stays
claimed and undelivered: not this version's to judge. Each step after the
claim is a span of the message's own trace (read only when tracing is on).
"""

import contextlib
from dataclasses import replace

from treemail.adapters import metrics, tracing
from treemail.adapters.proofmetrics import PROOF_FAILURES
from treemail.domain import blocks, envelope, notices, proof
from treemail.domain import commands as c
from treemail.domain import events as ev
from treemail.domain.decide import routing
from treemail.domain.peer_envelope import render_peer_message
from treemail.domain.proof import Keyring
from treemail.domain.records import SessionRecord
from treemail.domain.tracecontext import trace_id
from treemail.services.peers import PeerService
from treemail.services.sessionreader import NEWER

from ..tools import send_message as tool
from ..tools import table

from .shared import Part, Shared
from .types import Delivery


def render(event: ev.ProducerMessageAccepted, reply_hint: bool, *, text: str | None = None,
           verified: bool = False) -> Delivery:
    if text is None and event.owner == "agent":
        sender = event.sender_handle or event.sender_session_id
        text = envelope.render_agent_message(sender, event.body, reply_hint)
    elif text is None and event.owner in notices.NOTICE_KINDS:
        # Notices are treemail's own words, never rendered as (or credited to) an agent's message.
        text = notices.render_notice(event.owner, event.body)
    elif text is None:
        text = event.body
    parts = ({"type": "text", "text": text}, *blocks.image_parts(event.blocks))
    return Delivery(event.message_id, event.owner, event.mode, event.sender_session_id, text, parts,
                    principal=event.principal, verified=verified, sequence=event.pair_seq,
                    caused_by=event.caused_by, chain_id=event.chain_of, traceparent=event.traceparent,
                    trace_id=trace_id(event.traceparent))


def verdict(record: SessionRecord, message_id: str, event, keyring: Keyring | None) -> str:
    if event is None:
        return "unreadable"
    if event.owner != "agent" or keyring is None:
        return "unchecked"
    if event.message_id != message_id:
        return "mismatch"
    return proof.verify(event, record.session_id, keyring)


class Deliveries(Part):
    def __init__(self, shared: Shared, peers: PeerService, keyring: Keyring | None) -> None:
        super().__init__(shared)
        self._peers = peers
        self._keyring = keyring

    async def claim(self, session_id: str, run_id: str, step: int | None = None, *,
                    turn: bool = False) -> list[Delivery]:
        """``turn``: a new turn of a run that lasts (an MCP-only agent's mail check): queued mail is due too."""
        command = c.ClaimTurn(session_id, run_id) if turn else c.ClaimMail(session_id, run_id, step)
        claimed = [e for e in await self._sessions.execute(command) if isinstance(e, ev.ProducerMessageClaimed)]
        if not claimed:
            return []
        record = await self._reader.record(session_id)
        # The accepted events carry the bodies; claims name them by message id (only those are read).
        items = await self._reader.mail_items(record, [e.message_id for e in claimed])
        claimed_at = [(e.message_id, items[e.message_id].seq) for e in claimed if e.message_id in items]
        # Exact source: entries are read tolerantly and each source proof is checked.
        accepted = await self._reader.accepted_at(record, [seq for _, seq in claimed_at])
        for event in accepted.values():
            if isinstance(event, ev.ProducerMessageAccepted):
                with tracing.span("treemail.claim", event.traceparent, message_id=event.message_id,
                                  session_id=session_id, run_id=run_id, step=step):
                    pass
        # The recipient may answer where its model is offered send_message.
        view = self._views.of(record, await self._reader.state(record))
        reply_hint = await table.definition(tool.TOOL_NAME, view) is not None
        deliveries = await self.deliver(record, [(mid, accepted[seq]) for mid, seq in claimed_at], reply_hint)
        # The items were read after this claim, which they count: the ones before it showed it already.
        return [replace(d, shown_before=max(0, items[d.message_id].shown - 1)) if d.message_id in items else d
                for d in deliveries]

    async def deliver(self, record: SessionRecord, claimed: list[tuple[str, ev.Event | None]],
                      reply_hint: bool) -> list[Delivery]:
        """Deliveries of the claimed mail in order; a message whose proof fails is set aside and counted."""
        deliveries, back = [], None
        for message_id, event in claimed:
            if event is NEWER:
                continue
            judged = verdict(record, message_id, event, self._keyring)
            if judged not in ("ok", "unchecked"):
                PROOF_FAILURES.labels(reason=judged).inc()
                # Discarded, never delivered: the history keeps the entry and why it was refused.
                await self.discard(record.session_id, message_id, f"source_proof_{judged}")
                continue
            verified = judged == "ok"
            if event.principal is not None:
                if back is None:
                    back = (await self._peers.inbox(record))[1]
                text = render_peer_message(event.sender_handle or event.sender_session_id or "", event.principal,
                                           event.message_id, event.body, back.get(event.sender_session_id))
                deliveries.append(render(event, False, text=text, verified=verified))
            elif reply_hint and self._config.messaging.routing == "direct":
                # The recipient sees the tool, yet direct routing may not let it answer this sender.
                deliveries.append(render(event, await self.may_reply(record, event), verified=verified))
            else:
                deliveries.append(render(event, reply_hint, verified=verified))
        return deliveries

    async def may_reply(self, record: SessionRecord, event: ev.ProducerMessageAccepted) -> bool:
        sender = await self._reader.find(event.sender_session_id) if event.owner == "agent" else None
        return sender is not None and routing.may_address(self._config.messaging.routing, record, sender)

    async def consume(self, session_id: str, message_id: str, step: int | None, tokens: int | None) -> None:
        async with self._span("consume", session_id, message_id):
            # Recorded with the consume: the run's next send continues this span's trace.
            traceparent = tracing.traceparent() if tracing.enabled() else ""
            await self._sessions.execute(c.ConsumeMail(session_id, message_id, step, tokens, traceparent))

    async def release(self, session_id: str, message_id: str, reason: str) -> None:
        async with self._span("release", session_id, message_id):
            events = await self._sessions.execute(c.ReleaseMail(session_id, message_id, reason))
            metrics.count_steer_fallbacks(events)  # flow control: steer mail handed back at its last boundary

    async def discard(self, session_id: str, message_id: str, reason: str = "") -> None:
        async with self._span("discard", session_id, message_id):
            await self._sessions.execute(c.DiscardMail(session_id, message_id, reason))

    @contextlib.asynccontextmanager
    async def _span(self, step: str, session_id: str, message_id: str):
        """A delivery step is a span of the message's own trace (read only when tracing is on)."""
        if not tracing.enabled():
            yield
            return
        record = await self._reader.record(session_id)
        item = (await self._reader.mail_items(record, [message_id])).get(message_id)
        parent = item.trace if item else None
        with tracing.span(f"treemail.{step}", parent or None, message_id=message_id, session_id=session_id):
            yield
