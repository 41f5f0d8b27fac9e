"""The records' floor: the raw loop plus every record treemail keeps per accepted send, each at its least.

The raw baseline (raw.py) appends one event per command and answers nobody. An accepted send keeps
more than that (the session stream entry, a feed entry, the mail item, the
idempotency evidence, the answer). This loop writes exactly those, each in the fewest bytes that still
says what it must, and decides nothing: same backlog shape, same batch, one script call per command
and one XACK per batch, as raw.py. Per command, in one script (eight calls):

- the idempotency check on the sender's tool call (idempotency: a retried call gets the first answer);
- the recipient's and the sender's versions checked (a decision on stale state must not apply);
- the message on the recipient's stream (id, sender, mode, hops, body: what the envelope and the guards need);
- the mail item that keeps the message an obligation until it is processed (delivery as an obligation), beside the
  recipient's new version;
- the sender's record of it on the sender's stream (id, recipient: the send's retained status);
- the idempotency evidence ((run, tool call) -> message id, never deleted), beside the
  sender's new version;
- one feed entry naming both sessions and their new positions (projections follow the feed);
- the answer on the producer's reply list, which expires.

Why each byte that remains is there (`MEMORY USAGE` per message, 10,000 sends of a 200-byte body,
20 senders x 5 recipients; a bare `XADD` of the body is 219 bytes):

- the message, about 368 bytes: the bare entry's 219, plus the message id and the sender as UUID text
  (36 bytes each with their JSON keys: the protocol's events are JSON and name sessions and messages by
  their UUIDs' text, the form every tool result and host call shows), mode and hops (a dozen bytes), and
  the entry's type. The entry id is the recipient's version, so no position is written twice.
- the mail item, about 20 bytes: the message id's 16 bytes and a one-byte value in the recipient's
  state hash, packed (every value at most 64 bytes). Its position, sender and body are on the stream.
- the sender's record, about 114 bytes: an entry of the sender's stream with the message id and the
  recipient in UUID text (the retained status a sender or its controllers inspect).
- the idempotency evidence, about 35 bytes: the tool call's key ("<run> <tool call id>", the text the
  host gave) and the message id's 16 bytes, in the sender's packed state hash beside its version.
- the feed entry, about 52 bytes: one per send, the two sessions' 16 bytes each and their positions
  (the entry id is the stream's own).
- the reply list and the command stream are transient (an answer expires, the command is trimmed).

Where treemail's records differ, and why (its memory phase, `memory.by_kind`): the message also carries
the sender's handle, run and tool call and its number in the pair, and the time (the envelope's `from`,
causation and hops, the read receipt, and the retry budget need them); the mail item keeps its position,
the start of its retry budget and its sender beside the id (a claim and the delivery pump decide on the
items without reading the stream) in a hash of its own; the idempotency record also keeps the arguments'
fingerprint, the mode, the recipient's state and the number in the pair (a retry gets the whole first
answer, a changed call a conflict), in a hash of its own because the state hash holds the snapshot, whose
text is longer than a packed hash allows (the record would cost about 20 bytes more there); the feed
entry carries the protocol version (a reader knows the entry's form before it reads it); and the outbound
index (about 60 bytes: the message id's, the sender's 16 bytes and the record's position) lets a message be
inspected by its id alone, which the floor does not offer.

Can the floor reach 2.3x a bare XADD? At 590 bytes it is 2.7x. The message and the sender's record hold
four UUIDs in text; in binary they would take about 80 bytes less (about 2.33x), and that is outside what
the protocol allows: its events are JSON and its ids are the UUIDs' text. Packed hashes already hold the
records outside the events at their least. So no, not without ids in binary inside the events; the
floor's remaining excess over a bare XADD is the message's own id and sender, the sender's record, the
idempotency evidence and the feed entry, each of which a seed asks for.

What treemail spends beyond this floor is its decision (permissions, guards, folding, the
protocol's fields), not the records. If the floor alone is over a target, records treemail keeps
would have to go for the target to be met.
"""

import asyncio
import json
import time

import redis.asyncio as aioredis

from treemail.domain.ids import uuid7

from .memory import usage_by_kind, used_memory

STREAM = "floor:cmd"
GROUP = "floor-workers"
REPLY = "floor:reply"
FEED_MAXLEN = 1_000_000  # treemail's default `feed_maxlen`

# KEYS: 1 recipient stream, 2 recipient state, 3 sender stream, 4 sender state, 5 feed, 6 reply list
# ARGV: 1 and 2 the recipient's and the sender's expected versions, 3 the message, 4 the sender's record,
#       5 the idempotency key, 6 the message id (its 16 bytes), 7 the answer, 8 the feed's approximate length,
#       9 and 10 the recipient and the sender (their 16 bytes)
FLOOR_LUA = """
local sender = redis.call('HMGET', KEYS[4], 'version', ARGV[5])
if sender[2] then
  -- A retried tool call: the first answer again, and nothing written (idempotency).
  local hex = string.gsub(sender[2], '.', function(c) return string.format('%02x', string.byte(c)) end)
  local id = string.sub(hex, 1, 8) .. '-' .. string.sub(hex, 9, 12) .. '-' .. string.sub(hex, 13, 16) .. '-' ..
    string.sub(hex, 17, 20) .. '-' .. string.sub(hex, 21)
  redis.call('LPUSH', KEYS[6], '{"ok": {"message_id": "' .. id .. '"}}')
  return {'dup', id}
end
if tonumber(sender[1] or '0') ~= tonumber(ARGV[2]) then return {'conflict', ''} end
if tonumber(redis.call('HGET', KEYS[2], 'version') or '0') ~= tonumber(ARGV[1]) then return {'conflict', ''} end
local version, sent = tonumber(ARGV[1]) + 1, tonumber(ARGV[2]) + 1
redis.call('XADD', KEYS[1], version .. '-0', 'type', 'Accepted', 'data', ARGV[3])
redis.call('HSET', KEYS[2], 'version', version, ARGV[6], '0')
redis.call('XADD', KEYS[3], sent .. '-0', 'type', 'Sent', 'data', ARGV[4])
redis.call('HSET', KEYS[4], 'version', sent, ARGV[5], ARGV[6])
redis.call('XADD', KEYS[5], 'MAXLEN', '~', ARGV[8], '*', ARGV[9], version, ARGV[10], sent)
redis.call('LPUSH', KEYS[6], ARGV[7])
return {'ok', tostring(version)}
"""

# The kinds of key the floor keeps (the command stream and the reply list are transient).
KEPT = ("recipient events", "recipient state", "sender events", "sender state", "feed")
REPLY_TTL_S = 60


def session_key(session: str, kind: str) -> str:
    return f"floor:{session}:{kind}"


FEED = "floor:feed"  # one server, one feed: treemail keeps one per partition


def trees_of(trees: int, children: int) -> list[tuple[str, list[str]]]:
    """(root, children) with UUIDv7 session ids, as treemail's."""
    return [(uuid7(), [uuid7() for _ in range(children)]) for _ in range(trees)]


def pairs_of(trees: list[tuple[str, list[str]]]) -> list[tuple[str, str]]:
    """(sender, recipient): each tree's root sends to its children, as in treemail's phases."""
    return [(root, kid) for root, kids in trees for kid in kids]


async def prefill(redis: aioredis.Redis, commands: list[tuple[str, str, str]], first: int = 0) -> None:
    """(sender, recipient, body) each, numbered from ``first`` (the tool call ids must not repeat)."""
    try:
        await redis.xgroup_create(STREAM, GROUP, id="0", mkstream=True)
    except aioredis.ResponseError as exc:
        if "BUSYGROUP" not in str(exc):
            raise
    for start in range(0, len(commands), 5000):
        async with redis.pipeline(transaction=False) as pipe:
            for i, (sender, to, body) in enumerate(commands[start:start + 5000], first + start):
                command = {"from": sender, "run": "run-1", "call": f"call-{i}", "to": to, "mode": "steer", "body": body}
                pipe.xadd(STREAM, {"__data__": json.dumps(command)})
            await pipe.execute()


def script_call(cmd: dict, versions: dict[str, int], message_id: str) -> tuple:
    """The script's keys and arguments for one command (see FLOOR_LUA)."""
    to, sender = cmd["to"], cmd["from"]
    return (
        6, session_key(to, "events"), session_key(to, "state"), session_key(sender, "events"),
        session_key(sender, "state"), FEED, REPLY,
        versions[to], versions[sender],
        # The message: what the recipient's envelope and the send_message contract's guards need.
        json.dumps({"message_id": message_id, "from": sender, "mode": cmd["mode"], "hops": 1, "body": cmd["body"]}),
        json.dumps({"message_id": message_id, "to": to}),  # the sender's record of it (its retained status)
        f"{cmd['run']} {cmd['call']}",  # the idempotency key within the sender: (run, tool call)
        binary(message_id), json.dumps({"ok": {"message_id": message_id}}), FEED_MAXLEN, binary(to), binary(sender),
    )


def binary(uuid_text: str) -> bytes:
    """A UUID's 16 bytes: how an id is kept where it is not part of an event."""
    return bytes.fromhex(uuid_text.replace("-", ""))


async def run_worker(url: str, total: int, batch: int = 100) -> tuple[float, int]:
    """Write every prefilled command's records; returns (seconds, commands written)."""
    redis = aioredis.Redis.from_url(url)
    sha = await redis.script_load(FLOOR_LUA)
    decided = 0
    started = None
    try:
        while decided < total:
            reply = await redis.xreadgroup(GROUP, "floor-1", {STREAM: ">"}, count=batch, block=100)
            if not reply:
                continue
            if started is None:
                started = time.perf_counter()
            entries = reply[0][1]
            pending = [json.loads(fields[b"__data__"]) for _, fields in entries]
            while pending:
                sessions = list(dict.fromkeys(s for cmd in pending for s in (cmd["to"], cmd["from"])))
                async with redis.pipeline(transaction=False) as pipe:
                    for s in sessions:
                        pipe.hget(session_key(s, "state"), "version")
                    versions = {s: int(v or 0) for s, v in zip(sessions, await pipe.execute())}
                async with redis.pipeline(transaction=False) as pipe:
                    for cmd in pending:
                        pipe.evalsha(sha, *script_call(cmd, versions, uuid7()))
                        versions[cmd["to"]] += 1  # chained within the batch, as raw.py does
                        versions[cmd["from"]] += 1
                    results = await pipe.execute()
                pending = [cmd for cmd, result in zip(pending, results) if result[0] == b"conflict"]
            async with redis.pipeline(transaction=False) as pipe:  # one acknowledgement and lifetime per batch
                pipe.xack(STREAM, GROUP, *[entry_id for entry_id, _ in entries])
                pipe.expire(REPLY, REPLY_TTL_S)
                await pipe.execute()
            decided += len(entries)
        return time.perf_counter() - started, decided
    finally:
        await redis.aclose()


def kind_of(name: str, senders: set[str]) -> str | None:
    """The kind of one of the floor's keys (None for the transient ones: the command stream, the reply list)."""
    if name in (STREAM, REPLY):
        return None
    if name == FEED:
        return "feed"
    *_, session, kind = name.split(":")
    return f"{'sender' if session in senders else 'recipient'} {kind}"


async def kept_bytes_by_kind(redis: aioredis.Redis, senders: set[str]) -> dict[str, int]:
    """`MEMORY USAGE` (exact) of every key the floor keeps, summed by kind."""
    return {**dict.fromkeys(KEPT, 0), **await usage_by_kind(redis, senders, kind_of, match="floor:*")}


async def drop_transient(redis: aioredis.Redis) -> None:
    """Delete the command stream and the reply list, and wait until Valkey has freed them: a DEL of a
    large key frees it in the background (`lazyfree-lazy-user-del`), after `used_memory` is read."""
    await redis.delete(STREAM, REPLY)
    while int((await redis.info("memory"))["lazyfree_pending_objects"]):
        await asyncio.sleep(0.05)


async def phase_memory(url: str, sends: int, body_bytes: int, log) -> dict:
    """Bytes per accepted message over the floor's kept keys, after one warm-up send per pair (a
    session's keys exist before the measured sends, as in treemail's memory phase: 20 roots x 5)."""
    redis = aioredis.Redis.from_url(url)
    try:
        pairs = pairs_of(trees_of(20, 5))
        senders = {sender for sender, _ in pairs}
        await prefill(redis, [(s, r, "warm") for s, r in pairs])
        await run_worker(url, len(pairs))
        await drop_transient(redis)
        before, kinds_before = await used_memory(redis), await kept_bytes_by_kind(redis, senders)
        await prefill(redis, [(*pairs[i % len(pairs)], f"{i:08d}".ljust(body_bytes, "x")) for i in range(sends)],
                      first=len(pairs))
        await run_worker(url, sends)
        await drop_transient(redis)
        after, kinds_after = await used_memory(redis), await kept_bytes_by_kind(redis, senders)
    finally:
        await redis.aclose()
    by_kind = {kind: round((kinds_after[kind] - kinds_before[kind]) / sends, 1) for kind in KEPT}
    out = {"sends": sends, "bytes_per_message": (after - before) / sends, "by_kind": by_kind,
           "keys_bytes_per_message": round(sum(by_kind.values()), 1)}
    log(f"  floor memory: {out['bytes_per_message']:,.0f} bytes per {body_bytes}-byte message (used_memory); "
        f"by kind of key {by_kind}")
    return out
