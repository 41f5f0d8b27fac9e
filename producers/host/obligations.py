"""``tm.obligations``: mail as an obligation. Inspect and retry a sent message, see a session's pending
mail, and keep every obligation after a restart (``reconcile``); for the host API, the CLI and the model-facing
tools.

A message's status comes from two places the commit step keeps in step
with the streams: the sender's record in the partition's outbound index
(receipt, refusal, settlement) and, while it is unsettled, the item in the
recipient's pending mail (attempts, latest failure, parked). Only the
sender, a session it was delegated from (its controllers) and the host
(no caller) may read or retry it; every answer is a dict, errors included,
so a model-facing tool can return it as is.
"""

import json

from treemail.adapters import tracing
from treemail.domain import commands as c
from treemail.domain import events as ev
from treemail.domain.errors import Code, LifecycleError, NotFound, UnknownSessionError
from treemail.domain import limits, outbox
from treemail.domain.outbound import may_inspect, status_of
from treemail.domain.records import SessionRecord
from treemail.domain.results import error_result
from treemail.domain.state import MailItem
from treemail.domain.tracecontext import trace_id
from treemail.services.disposal import DisposalService
from treemail.services.obligations import ObligationService
from treemail.services.peerdelivery import PeerDriver
from treemail.services.peers import PeerService
from treemail.services.triggers import Triggers

from ..tools.message import render

from .shared import Part, Shared

# Delegation trees are shallow; this only bounds a walk over a corrupt directory.
MAX_DEPTH = 256


def unknown(message_id: str) -> dict:
    return error_result(Code.UNKNOWN_MESSAGE.value, f"no message you may see has id {limits.shown(message_id, 80)}")


def denied() -> dict:
    return error_result(Code.PERMISSION_DENIED.value,
                        "permission denied: only the sender, the sessions it was delegated from and the host "
                        "may inspect, cancel or retry a message")


def settled(message_id: str) -> dict:
    return error_result(Code.SETTLED.value, f"message {limits.shown(message_id, 80)} was already processed or "
                                            "refused; it cannot be retried, send a new one")


class Obligations(Part):
    def __init__(self, shared: Shared, sweeper: ObligationService, disposal: DisposalService, triggers: Triggers, *,
                 peers: PeerService | None = None, peer_driver: PeerDriver | None = None) -> None:
        super().__init__(shared)
        self._sweeper = sweeper
        self._disposal = disposal
        # The runners' wake triggers: those never acknowledged, and whether they can be followed at all.
        self._triggers = triggers
        self._peers = peers
        self._peer_driver = peer_driver

    async def announce(self, session_id: str) -> None:
        """Say that the host gave this child its task directly, not as treemail mail: its end is then owed to
        its parent as a settlement notice, like that of a child sent mail. A child never announced and never
        sent anything owes none (``not_announced``). Idempotent: ``SessionAnnounced`` is written once. At
        registration or with the first run: ``register_child(..., announced=True)``,
        ``start_run(..., announced=True)``, each in the same step."""
        await self._sessions.execute(c.AnnounceSession(session_id))

    async def ancestors(self, record: SessionRecord) -> list[str]:
        """The sessions ``record`` was delegated from, parent first."""
        out: list[str] = []
        parent = record.parent_session_id
        while parent is not None and len(out) < MAX_DEPTH:
            out.append(parent)
            found = await self._reader.find(parent)
            parent = found.parent_session_id if found is not None else None
        return out

    async def _granted(self, sender: SessionRecord, destination: str, operation: str) -> bool:
        if self._peers is None:
            return False
        try:
            return (await self._peers.authorize(sender.session_id, destination, operation)).allowed
        except (UnknownSessionError, ValueError):  # a destination gone grants nothing
            return False

    async def _locate(self, message_id: str, caller: str | None, operation: str = "read"):
        """(the index's find: sender and its records, recipient record, pending item) or an error dict."""
        try:  # before any read: a 4 MiB id is refused here, never sent to the server (16 times, one a partition)
            limits.require_id("message_id", message_id)
            limits.require_id("caller_session_id", caller, optional=True)
        except limits.IdentifierError as refused:
            return error_result(refused.code, refused.message)
        everywhere = list(range(self._config.service.partitions))
        found = None
        if caller is not None:
            record = await self._reader.find(caller)
            # The sender and the sessions it was delegated from share its tree's partition: looked at first.
            found = await self._sweeper.find_sent(message_id, [record.partition]) if record else None
            if found is None:
                # Elsewhere, the caller is a stranger to the message whichever partition holds it: the answer
                # is the same from every partition, ``permission_denied`` for a message that exists.
                elsewhere = [p for p in everywhere if record is None or p != record.partition]
                if await self._sweeper.find_sent(message_id, elsewhere) is not None:
                    return denied()
                return unknown(message_id)
        else:
            found = await self._sweeper.find_sent(message_id, everywhere)
        if found is None:
            return unknown(message_id)
        sender = await self._reader.find(found.sender_id)
        if sender is None:
            return unknown(message_id)
        if not may_inspect(caller, sender.session_id, await self.ancestors(sender)):
            return denied()
        destination = _destination(found.sent)
        if caller is not None and _is_peer(found.sent) and not await self._granted(sender, destination, operation):
            # Peer mail: the destination decides what its sources may read or control there, deny by default.
            return error_result(Code.PEER_NOT_GRANTED.value,
                                f"permission denied: the sender holds no `{operation}` grant for this message's peer")
        if isinstance(found.sent, ev.PeerIntentStored):
            row = (await self._reader.state(sender)).outbox.get(message_id)
            return found, None, row
        recipient = await self._reader.find(destination)
        item = None
        if found.settled is None and isinstance(found.sent, ev.MessageSent) and recipient is not None:
            item = (await self._reader.mail_items(recipient, [message_id])).get(message_id)
        return found, recipient, item

    async def inspect(self, message_id: str, caller_session_id: str | None = None) -> dict:
        """A sent message's status: accepted with its receipt, processed, parked or refused.

        ``caller_session_id``: the session asking (the sender or a session it
        was delegated from); None is the host itself. Errors are dicts with a
        stable code (``message:unknown``, ``permission_denied``).
        """
        located = await self._locate(message_id, caller_session_id)
        if isinstance(located, dict):
            return located
        found, recipient, item = located
        if isinstance(found.sent, ev.PeerIntentStored):
            if found.settled is not None:  # discarded by the host before any admission
                settled_record = found.settled
                return {"message_id": message_id, "sender_session_id": found.sender_id,
                        "recipient_session_id": found.sent.destination_session_id, "peer": found.sent.peer,
                        "status": "processed", "reason": settled_record.reason or None,
                        "settlement": {"outcome": settled_record.outcome, "reason": settled_record.reason,
                                       "at": settled_record.at}}
            if item is None:
                return unknown(message_id)
            status = outbox.status_of(item, found.sender_id, self._config.messaging, self._clock.now())
            if traced := trace_id(found.sent.traceparent):
                status["trace_id"] = traced  # not admitted yet: no number or cause, but its trace from the start
            return status
        status = status_of(message_id, found.sender_id, found.sent, found.settled, item, self._config.messaging,
                           self._clock.now())
        if "receipt" in status and recipient is not None:
            status["receipt"].update(await self._provenance(recipient, message_id, found.sent.position))
        return {**status, "peer": found.sent.peer} if found.sent.peer else status

    async def _provenance(self, recipient: SessionRecord, message_id: str, position: int) -> dict:
        """What the accepted event itself says of the message's history (its cause, chain and trace): kept
        there only, not on the sender's record, so a send costs no more bytes for what inspect reads rarely."""
        accepted = (await self._reader.read_at(recipient, [position])).get(position)
        if not isinstance(accepted, ev.ProducerMessageAccepted) or accepted.message_id != message_id:
            return {}  # the recipient's stream no longer holds it there (trimmed, or a ghost's)
        return {"caused_by": accepted.caused_by, "chain_id": accepted.chain_of,
                "trace_id": trace_id(accepted.traceparent)}

    async def retry(self, message_id: str, caller_session_id: str | None = None) -> dict:
        """Renew a parked message's retry budget; ``retry_message:settled`` for a processed or refused one."""
        located = await self._locate(message_id, caller_session_id, "control")
        if isinstance(located, dict):
            return located
        found, recipient, item = located
        if isinstance(found.sent, ev.PeerIntentStored):
            return await self._retry_peer(message_id, found, caller_session_id)
        if found.settled is not None or isinstance(found.sent, ev.MessageRefused):
            return settled(message_id)
        if item is None or item.state != "parked":
            return error_result(Code.NOT_PARKED.value,
                                f"message {message_id} is not parked ({item.state if item else 'in flight'}); "
                                "it is still being delivered")
        try:
            with tracing.span("treemail.retry", item.trace or None, message_id=message_id,
                              session_id=recipient.session_id):
                await self._sessions.execute(c.RetryMail(recipient.session_id, message_id), recipient)
        except LifecycleError as error:
            if error.code == "lifecycle:unknown_message":
                return settled(message_id)  # discarded meanwhile
            return error_result(Code.NOT_PARKED.value, error.message)
        return await self.inspect(message_id, caller_session_id)

    async def cancel(self, message_id: str, caller_session_id: str | None = None) -> dict:
        """Take a sent message back: ``cancelled`` if no claim took it yet (it never reaches a model, and its
        sender's settlement says ``cancelled``), ``already_delivered`` once a claim did or it was processed.

        Decided on the recipient's stream, where claims are decided, so a claim and a cancel racing on any
        number of workers are ordered there: never both. ``caller_session_id``: the sender or a session it
        was delegated from; None is the host. A message already discarded (expired, superseded, cancelled)
        answers ``cancelled`` with its reason."""
        located = await self._locate(message_id, caller_session_id, "control")
        if isinstance(located, dict):
            return located
        found, recipient, _ = located
        if isinstance(found.sent, ev.MessageRefused):
            return settled(message_id)
        by = "host" if caller_session_id is None else "sender" if caller_session_id == found.sender_id else "ancestor"
        if found.settled is not None:
            # Settled before the cancel (consumed, expired, superseded, ...): answered as it was settled, and the
            # answer recorded like every other, where the message was (its recipient, or its source's outbox).
            how = "consumed" if found.settled.outcome == "consumed" else found.settled.reason or "discarded"
            try:
                if isinstance(found.sent, ev.PeerIntentStored):
                    sender = await self._reader.record(found.sender_id)
                    await self._sessions.execute(c.CancelPeerDelivery(sender.session_id, message_id, by, how), sender)
                elif recipient is not None:
                    await self._sessions.execute(c.CancelMail(recipient.session_id, message_id, by, how), recipient)
            except LifecycleError:
                pass  # the stream that held it is gone (a session no longer registered): the answer stands
            return _cancel_answer(message_id, found.settled, by)
        if isinstance(found.sent, ev.PeerIntentStored):
            # Peer mail still in its source's outbox: cancelled there, where its admission attempts start.
            sender = await self._reader.record(found.sender_id)
            try:
                events = await self._sessions.execute(c.CancelPeerDelivery(sender.session_id, message_id, by), sender)
            except LifecycleError as error:
                return error_result(error.code, error.message)
        elif recipient is None:
            return _cancel_answer(message_id, None, by)
        else:
            events = await self._sessions.execute(c.CancelMail(recipient.session_id, message_id, by), recipient)
        answer = next((e for e in events if isinstance(e, ev.MessageCancelAnswered)), None)
        if answer is None:
            return _cancel_answer(message_id, None, by)
        return {"message_id": message_id, "outcome": answer.outcome, "by": by}

    async def _retry_peer(self, message_id: str, found, caller_session_id: str | None) -> dict:
        """A parked peer delivery gets a new budget on its source, and is due at once."""
        sender = await self._reader.record(found.sender_id)
        try:
            await self._sessions.execute(c.RetryPeerDelivery(sender.session_id, message_id), sender)
        except LifecycleError as error:
            code = Code.SETTLED.value if error.code == Code.SETTLED.value else Code.NOT_PARKED.value
            return error_result(code, error.message)
        if self._peer_driver is not None:
            await self._peer_driver.due.touch(sender, self._peer_driver.clock.now())
        return await self.inspect(message_id, caller_session_id)

    async def pending_mail(self, session_id: str) -> list[MailItem]:
        record = await self._reader.record(session_id)
        return sorted((await self._reader.mail(record)).values(), key=lambda m: m.seq)

    async def unacknowledged_wakes(self, consumer: str, after: dict[str, str] | None = None) -> list:
        """The wake triggers runner ``consumer`` read and never acknowledged, past ``after`` (wake stream ->
        entry id; all of a stream it does not name): what a follower that reconnects never received."""
        return await self._triggers.unacknowledged_wakes(consumer, after)

    async def probe(self) -> str | None:
        """None while wakes can be followed and answered: the server answers and every wake stream has the
        runners' group (recreated here when a server came back without its data, as a worker recreates its
        own); raises when the server cannot be reached. A process serving the host API reports it as ready."""
        await self._triggers.probe()
        return None

    async def reconcile(self, interrupted_runs: bool = False) -> int:
        """After a restart: make sure every obligation is kept; what the delivery pump does at start.

        With ``interrupted_runs`` (the host restarted, so no run survived),
        runs still open in the streams are finished, which releases the mail
        they had claimed, and their sessions become idle. Then every session
        with pending mail gets ``KeepObligations``: expired claims released,
        passed deadlines parked, and a sleeping session with mail due asked to
        wake again, even if a wake was requested before this call (its trigger
        may be lost). Returns the number of wakes requested; a duplicate
        trigger is harmless. With ``interrupted_runs``, every disposal the
        host did not live to complete after its cutoff is completed (disposal
        cutoff: nothing the closing session held is left behind).
        """
        started = self._clock.now()
        finished: list[ev.Event] = []
        if interrupted_runs:
            for p in range(self._config.service.partitions):
                for session_id in await self._reader.partition_sessions(p):
                    record = await self._reader.record(session_id)
                    state = await self._reader.state(record)
                    run = state.current_run
                    if run is not None:
                        finished += await self._sessions.execute(c.FinishRun(session_id, run, interrupted=True),
                                                                 record)
                        finished += await self._sessions.execute(c.ChangeStatus(session_id, "idle"), record)
                    if state.disposal == "closing":
                        await self._disposal.complete_interrupted(session_id)
        woken = sum(isinstance(e, ev.SessionWakeRequested) for e in finished)
        return woken + (await self._sweeper.sweep(stale_before=started)).wakes


def _cancel_answer(message_id: str, settled_record, by: str) -> dict:
    """A message settled before the cancel: processed (delivered), or discarded with its reason."""
    if settled_record is not None and settled_record.outcome == "discarded":
        return {"message_id": message_id, "outcome": "cancelled", "by": by, "reason": settled_record.reason}
    return {"message_id": message_id, "outcome": "already_delivered", "by": by}


def _is_peer(sent) -> bool:
    return isinstance(sent, ev.PeerIntentStored) or bool(getattr(sent, "peer", ""))


def _destination(sent) -> str:
    return sent.destination_session_id if isinstance(sent, ev.PeerIntentStored) else sent.recipient_session_id


# ---- for `treemail inspect` and `treemail retry` (the host's view: no caller) -------------------------


async def cli_inspect(obligations: Obligations, message_id: str, as_json: bool = False) -> str:
    """The text `treemail inspect MESSAGE_ID [--json]` prints; an error raises ``NotFound`` (a LookupError: one
    line, exit 2)."""
    return _cli_text(await obligations.inspect(message_id), as_json)


async def cli_retry(obligations: Obligations, message_id: str) -> str:
    """The text `treemail retry MESSAGE_ID` prints; an error raises ``NotFound`` (a LookupError: one line,
    exit 2)."""
    return _cli_text(await obligations.retry(message_id), False)


def _cli_text(status: dict, as_json: bool) -> str:
    if "error" in status:
        raise NotFound(status["error"]["code"], status["error"]["message"])
    return json.dumps(status, sort_keys=True) if as_json else render(status)
