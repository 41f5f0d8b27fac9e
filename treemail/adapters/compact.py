"""The stored forms of the records kept per accepted send that are not events: each in its least form.

An accepted send keeps, beside its events, a mail item (until the message is processed), the tool call's
idempotency record (for as long as the sender's session) and a feed entry (until the feed is trimmed).
Every byte of them is paid once per message for as long as it is kept, so each is written here in the
fewest bytes that still read back exactly what was written:

- ids in binary where they are UUIDs in their canonical text (what treemail's own ids always are): a
  UUID is 16 bytes, its text 36; base64url (22 characters) where the record is text. An id in any other
  form is written as it is, behind a ``~`` that a UUID's form never starts with.
- no field the other records hold, no field at its default.
- values of at most 64 bytes where the server keeps them in a hash: Valkey packs a small hash's fields
  and values into one listpack (a few bytes each) while every value is that short; one longer value turns
  the whole hash into a table of separately allocated entries, about 80 bytes more per field. A packed
  hash is searched and rewritten whole, so its reads and writes cost more as it fills: with a sender's
  records packed (up to `hash-max-listpack-entries`, 512 by default) a send cost Valkey about 10 us more
  than with every hash a table (30,000 sends, `INFO commandstats`). The server's setting chooses between
  the bytes and that time; the forms here are the least either way.

Every reader decodes the older forms too (what an earlier version wrote stays readable): each decoder
tells the forms apart by their first character or their types.
"""

import base64
import functools
import binascii
import re

import orjson

from ..domain import compactjson
from ..domain.state import MailItem

_UUID = re.compile(r"^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$")
_HEX32 = re.compile(r"^[0-9a-f]{32}$")
# Written before an id that is not stored in binary: never the first character of the other forms.
TEXT = "~"


def _uuid_text(raw: bytes) -> str:
    digits = raw.hex()
    return f"{digits[:8]}-{digits[8:12]}-{digits[12:16]}-{digits[16:20]}-{digits[20:]}"


def _b64(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


@functools.lru_cache(maxsize=4096)
def id_text(session_id: str) -> str:
    """A session or message id in 22 characters when it is a UUID's canonical text, else ``~`` + the id."""
    if _UUID.match(session_id):
        return _b64(bytes.fromhex(session_id.replace("-", "")))
    return TEXT + session_id


def id_from_text(text: str) -> str:
    return text[1:] if text.startswith(TEXT) else _uuid_text(_unb64(text))


@functools.lru_cache(maxsize=4096)
def id_bytes(session_id: str) -> bytes:
    """A session id as a feed entry's field: 16 bytes for a UUID's canonical text (unless its first byte is
    ``~``, then as text), else ``~`` + the id."""
    if _UUID.match(session_id) and not session_id.startswith("7e"):
        return bytes.fromhex(session_id.replace("-", ""))
    return (TEXT + session_id).encode()


def id_from_bytes(raw: bytes) -> str:
    if raw[:1] == TEXT.encode():
        return raw[1:].decode()
    if len(raw) == 16:
        return _uuid_text(raw)
    return raw.decode()


# ---- the mail item ---------------------------------------------------------------------------------
#
# A JSON array: the stream position and the time its retry budget started (both always), then the sender
# (as ``id_text``, or null), hops, mode, delivery state, owner, run, and the attempt, expiry, priority and
# stranded fields, each left out from the end while at its default. The message id is the hash field, the
# body and the rest of the message are on the stream at the position. An item of a plain accepted message is
# ``[seq, since, "<22 characters>"]``, about 50 bytes. Told from the forms before it by its second value, a
# number where they had the owner's name (or started with the message id).

_ITEM_DEFAULTS = (None, 0, "steer", "accepted", "agent", None, 0, 0.0, 0.0, "", "", False, 0.0, "", 0, False, 0, "")


def encode_item(item: MailItem) -> str:
    sender = None if item.sender_session_id is None else id_text(item.sender_session_id)
    rest = [sender, item.agent_hop, item.mode, item.state, item.owner, item.run_id, item.attempts,
            item.claimed_at, item.retry_at, item.reason, item.trace, item.peer, item.expires_at,
            item.supersede_key, item.passed, item.urgent, item.shown, item.stranded]
    end = len(rest)
    while end and rest[end - 1] == _ITEM_DEFAULTS[end - 1] and type(rest[end - 1]) is type(_ITEM_DEFAULTS[end - 1]):
        end -= 1
    return compactjson.dumps([item.seq, item.since, *rest[:end]])


def decode_item(message_id: str, raw: str | bytes) -> MailItem:
    fields = orjson.loads(raw)
    if len(fields) < 2 or isinstance(fields[0], str) or isinstance(fields[1], str):
        return MailItem.from_json(message_id, raw)  # an earlier form
    seq, since, *rest = fields
    rest += _ITEM_DEFAULTS[len(rest):]
    sender, hop, mode, state, owner, run_id, attempts, claimed_at, retry_at, reason, trace, peer, \
        expires_at, supersede_key, passed, urgent, shown, stranded = rest
    return MailItem(message_id, owner, None if sender is None else id_from_text(sender), hop, mode, state, run_id,
                    seq, attempts, since, claimed_at, retry_at, reason, trace, peer, expires_at, supersede_key,
                    passed, urgent, shown, stranded)


# ---- the idempotency record ------------------------------------------------------------------------
#
# An accepted send's record (``[fingerprint, message id, mode, recipient state]`` in the domain, and the
# sequence after them where the result carried it) is kept as text: the fingerprint's 16 bytes and the
# message id's in base64url (22 characters each), the sequence if any, then the mode and the recipient state
# only where they are not ``steer`` and ``running``: ``<fp><id>`` (44 bytes against the array's 93), or
# ``<fp><id>7``. Told from the JSON forms by its first character (theirs
# is ``[`` or ``{``). Any other record is kept as JSON, as before.

_RECORD_DEFAULTS = ("steer", "running")


def record_field(digest: str) -> str | bytes:
    """A tool call's field in its session's idempotency hash: the digest's 16 bytes (an earlier version
    wrote its 32 hex characters, which readers still look for); any other key as it is."""
    return bytes.fromhex(digest) if _HEX32.match(digest) else digest


def record_fields(digest: str) -> tuple[str | bytes, str]:
    """Where a tool call's record may be, to read in one HMGET: its field, then the field an earlier version
    wrote it under (the digest's text)."""
    return record_field(digest), digest


def kept_record(values: list) -> list | dict | None:
    """The record an HMGET of ``record_fields`` found (under its field first), decoded; None if neither held one."""
    raw = next((value for value in values if value is not None), None)
    return decode_record(raw) if raw is not None else None


def encode_record(record: list | dict) -> str:
    numbered = type(record) is list and len(record) == 5 and type(record[4]) is int and record[4] >= 0
    if ((numbered or (type(record) is list and len(record) == 4))
            and type(record[0]) is str and _HEX32.match(record[0]) and type(record[1]) is str
            and _UUID.match(record[1]) and all(type(v) is str and v and " " not in v for v in record[2:4])):
        fp, message_id, mode, state = record[:4]
        sequence = str(record[4]) if numbered else ""  # unnumbered: the result's three keys only
        tail = f" {mode} {state}" if state != "running" else f" {mode}" if mode != "steer" else ""
        return _b64(bytes.fromhex(fp)) + _b64(bytes.fromhex(message_id.replace("-", ""))) + sequence + tail
    return compactjson.dumps(record)


def decode_record(raw: str | bytes) -> list | dict:
    text = raw.decode() if isinstance(raw, bytes) else raw
    if text[:1] in ("[", "{", '"'):
        return orjson.loads(text)
    head, *tail = text.split(" ")
    try:
        if len(head) < 44:
            raise ValueError("too short")
        fp, message_id = _unb64(head[:22]).hex(), _uuid_text(_unb64(head[22:44]))
        sequence = [int(head[44:])] if head[44:] else []
    except (binascii.Error, ValueError) as exc:
        raise ValueError(f"not an idempotency record: {text!r}") from exc
    tail += _RECORD_DEFAULTS[len(tail):]
    return [fp, message_id, *tail, *sequence]


# ---- the outbound index ----------------------------------------------------------------------------
#
# One field per message for as long as the partition keeps it (and one more once it is settled): the
# message id as ``id_bytes``, settled with ``\0s`` after it, and where the sender's record is, the
# sender's ``id_bytes`` then its position on the sender's stream: 16 + about 20 bytes against 36 + 38 in
# text, about half of the hash entry (the index holds more fields than a hash is kept packed for).
# The fields an earlier version wrote (the message id as text) stay where they are: a reader asks for
# both (``outbound_fields``), and the field it finds says the value's form.

_SETTLED = b"\x00s"


def outbound_fields(message_id: str) -> tuple[bytes, bytes]:
    """The message's sent and settled fields in the index."""
    name = id_bytes(message_id)
    return name, name + _SETTLED


def encode_outbound(pairs: list[str]) -> list[bytes]:
    """The index's (field, value) pairs as ``outbound.index_entries`` writes them ("<message id>" or
    "<message id>:settled" -> "<sender> <position>"), in their stored form."""
    out: list[bytes] = []
    for name, value in zip(pairs[::2], pairs[1::2]):
        message_id, settled = (name[:-8], True) if name.endswith(":settled") else (name, False)
        sender, _, position = value.rpartition(" ")
        sent_field, settled_field = outbound_fields(message_id)
        out.append(settled_field if settled else sent_field)
        out.append(_sender_field(sender) + position.encode())
    return out


def _sender_field(sender: str) -> bytes:
    name = id_bytes(sender)
    return name + b" " if name[:1] == TEXT.encode() else name


def decode_outbound(raw: bytes) -> tuple[str, int]:
    """(sender, position) of a value ``encode_outbound`` wrote."""
    if raw[:1] == TEXT.encode():
        sender, _, position = raw.rpartition(b" ")
        return id_from_bytes(sender), int(position)
    return id_from_bytes(raw[:16]), int(raw[16:])
