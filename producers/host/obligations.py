"""Inspect and retry a sent message (seed 004), for the host API, the CLI and the model-facing tools.

A message's status comes from two places the commit step keeps in step
with the streams: the sender's record in the partition's outbound index
(receipt, refusal, settlement) and, while it is unsettled, the item in the
recipient's pending mail (attempts, latest failure, parked). Only the
sender, a session it was delegated from (its controllers) and the host
(no caller) may read or retry it; every answer is a dict, errors included,
so a model-facing tool can return it as is.
"""

import json
import time

from treemail.adapters import outboundindex, tracing
from treemail.domain import commands as c
from treemail.domain import events as ev
from treemail.domain.errors import Code, LifecycleError
from treemail.domain.outbound import may_inspect, status_of
from treemail.domain.records import SessionRecord
from treemail.domain.results import error_result

# Delegation trees are shallow; this only bounds a walk over a corrupt directory.
MAX_DEPTH = 256


async def ancestors(host, record: SessionRecord) -> list[str]:
    """The sessions ``record`` was delegated from, parent first."""
    out: list[str] = []
    parent = record.parent_session_id
    while parent is not None and len(out) < MAX_DEPTH:
        out.append(parent)
        found = await host.store.directory.get(parent)
        parent = found.parent_session_id if found is not None else None
    return out


def _unknown(message_id: str) -> dict:
    return error_result(Code.UNKNOWN_MESSAGE.value, f"no message you may see has id {message_id}")


async def _locate(host, message_id: str, caller: str | None):
    """(the index's find: sender and its records, recipient record, pending item) or an error dict."""
    if caller is not None:
        record = await host.store.directory.get(caller)
        if record is None:
            return _unknown(message_id)
        partitions = [record.partition]
    else:
        partitions = list(range(host.config.service.partitions))
    found = await outboundindex.find(host.redis, message_id, partitions)
    if found is None:
        return _unknown(message_id)
    sender = await host.store.directory.get(found.sender_id)
    if sender is None:
        return _unknown(message_id)
    if not may_inspect(caller, sender.session_id, await ancestors(host, sender)):
        return error_result(Code.PERMISSION_DENIED.value,
                            "permission denied: only the sender, the sessions it was delegated from and the host "
                            "may inspect or retry a message")
    recipient = await host.store.directory.get(found.sent.recipient_session_id)
    item = None
    if found.settled is None and isinstance(found.sent, ev.MessageSent) and recipient is not None:
        item = (await host.store.load_mail_items(recipient, [message_id])).get(message_id)
    return found, recipient, item


async def inspect(host, message_id: str, caller: str | None = None) -> dict:
    located = await _locate(host, message_id, caller)
    if isinstance(located, dict):
        return located
    found, _, item = located
    return status_of(message_id, found.sender_id, found.sent, found.settled, item, host.config.messaging,
                     time.time())


async def retry(host, message_id: str, caller: str | None = None) -> dict:
    """Renew a parked message's budget; a processed or refused one cannot be rewound."""
    located = await _locate(host, message_id, caller)
    if isinstance(located, dict):
        return located
    found, recipient, item = located
    if found.settled is not None or isinstance(found.sent, ev.MessageRefused):
        return _settled(message_id)
    if item is None or item.state != "parked":
        return error_result(Code.NOT_PARKED.value,
                            f"message {message_id} is not parked ({item.state if item else 'in flight'}); "
                            "it is still being delivered")
    try:
        with tracing.span("treemail.retry", item.trace or None, message_id=message_id,
                          session_id=recipient.session_id):
            await host.sessions.execute(c.RetryMail(recipient.session_id, message_id), recipient)
    except LifecycleError as error:
        if error.code == "lifecycle:unknown_message":
            return _settled(message_id)  # discarded meanwhile
        return error_result(Code.NOT_PARKED.value, error.message)
    return await inspect(host, message_id, caller)


def _settled(message_id: str) -> dict:
    return error_result(Code.SETTLED.value,
                        f"message {message_id} was already processed or refused; it cannot be retried, send a new one")


# ---- for `treemail inspect` and `treemail retry` (the host's view: no caller) -------------------------


async def cli_inspect(host, message_id: str, as_json: bool = False) -> str:
    """The text `treemail inspect MESSAGE_ID [--json]` prints; an error raises LookupError (one line, exit 2)."""
    return _cli_text(await inspect(host, message_id), as_json)


async def cli_retry(host, message_id: str) -> str:
    """The text `treemail retry MESSAGE_ID` prints; an error raises LookupError (one line, exit 2)."""
    return _cli_text(await retry(host, message_id), False)


def _cli_text(status: dict, as_json: bool) -> str:
    if "error" in status:
        raise LookupError(f"{status['error']['code']}: {status['error']['message']}")
    return json.dumps(status, sort_keys=True) if as_json else render(status)


def render(status: dict) -> str:
    """One line per fact, for `treemail inspect` (errors are one line too)."""
    if "error" in status:
        return f"{status['error']['code']}: {status['error']['message']}"
    lines = [f"{status['message_id']}  {status['status']}"]
    receipt = status.get("receipt")
    if receipt:
        lines.append(f"  to {receipt['recipient_session_id']} at position {receipt['position']} "
                     f"({receipt['recipient_state']} at acceptance)")
    elif status.get("recipient_session_id"):
        lines.append(f"  to {status['recipient_session_id']}")
    for key in ("delivery", "attempts", "reason", "next_attempt_at", "deadline_at"):
        if status.get(key) is not None:
            lines.append(f"  {key}: {status[key]}")
    if status.get("settlement"):
        lines.append(f"  settlement: {status['settlement']['outcome']} {status['settlement']['reason']}".rstrip())
    return "\n".join(lines)
