"""The source proof of an accepted message (sender identity): a keyed MAC over who sent what to whom. Pure.

Whoever decides a send signs its ``ProducerMessageAccepted`` with the current
key of a keyring that lives in configuration or a secret file, never in the
streams. The MAC covers the sender (session and handle), its incarnation (the
run), the tool call, the recipient, the principal, the return address, the
route, the reply reference, the mode, the hop, the time and a digest of the
body and its blocks. Delivery recomputes it: a stream entry altered after
acceptance (any of those fields, or the body) no longer matches, and is never
delivered as genuine. The key id is recorded beside the MAC, so a rotated
keyring that keeps the old keys still verifies older messages.
"""

import hashlib
import hmac
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

from . import events as ev
from .errors import ConfigError

VERSION = 1
Verdict = Literal["ok", "missing", "unknown_key", "mismatch"]


@dataclass(frozen=True)
class Keyring:
    """``current`` signs; every key verifies the messages it signed."""

    current: str
    keys: Mapping[str, bytes]

    def __post_init__(self) -> None:
        if self.current not in self.keys:
            raise ConfigError(f"the signing key {self.current!r} is not in the keyring")


def _digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def material(event: ev.ProducerMessageAccepted, recipient_session_id: str, key_id: str) -> bytes:
    """The canonical bytes the MAC covers; every field is positional, so none can move to another's place."""
    blocks = json.dumps(event.blocks, sort_keys=True, separators=(",", ":")) if event.blocks else ""
    fields = [
        VERSION, key_id, event.message_id, recipient_session_id, event.owner, event.producer_id,
        event.sender_session_id, event.sender_handle, event.return_address, event.run_id, event.tool_call_id,
        event.principal, event.peer, event.in_reply_to, event.reply, event.mode, event.agent_hop, repr(event.at),
        _digest(event.body.encode("utf-8", "surrogatepass")), _digest(blocks.encode()) if blocks else "",
    ]
    return json.dumps(fields, separators=(",", ":"), ensure_ascii=True).encode()


def _mac(key: bytes, data: bytes) -> str:
    return hmac.new(key, data, hashlib.sha256).hexdigest()


def sign(event: ev.ProducerMessageAccepted, recipient_session_id: str, keyring: Keyring) -> ev.ProducerMessageAccepted:
    key_id = keyring.current
    mac = _mac(keyring.keys[key_id], material(event, recipient_session_id, key_id))
    return event.model_copy(update={"proof": {"v": VERSION, "key_id": key_id, "mac": mac}})


def verify(event: ev.ProducerMessageAccepted, recipient_session_id: str, keyring: Keyring) -> Verdict:
    proof = event.proof
    if not isinstance(proof, dict) or not isinstance(proof.get("mac"), str) or proof.get("v") != VERSION:
        return "missing"
    key_id = proof.get("key_id")
    key = keyring.keys.get(key_id) if isinstance(key_id, str) else None
    if key is None:
        return "unknown_key"
    expected = _mac(key, material(event, recipient_session_id, key_id))
    return "ok" if hmac.compare_digest(expected, proof["mac"]) else "mismatch"


def sign_events(events: list[ev.Event], recipient_session_id: str, keyring: Keyring | None) -> list[ev.Event]:
    """Every agent message among ``events`` signed (unchanged without a keyring: proofs are then off)."""
    if keyring is None:
        return events
    return [
        sign(e, recipient_session_id, keyring) if isinstance(e, ev.ProducerMessageAccepted) and e.owner == "agent"
        else e
        for e in events
    ]
