"""Every Redis key treemail uses, in one place.

A tree's keys share the hash tag of the tree's partition, ``{p<N>}``: a send, a
lifecycle transition and its idempotency record are one atomic step on one
hash slot, on a single server and on a Redis/Valkey Cluster alike. The
directory (session id -> origin) is written once at registration and only read
afterwards, so it may live in any slot.
"""

import zlib

PREFIX = "tm"


def partition_of(root_session_id: str, partitions: int) -> int:
    return zlib.crc32(root_session_id.encode()) % partitions


def tag(partition: int) -> str:
    return f"{{p{partition}}}"


def session_stream(partition: int, session_id: str) -> str:
    return f"{PREFIX}:{tag(partition)}:s:{session_id}:events"


def session_snapshot(partition: int, session_id: str) -> str:
    return f"{PREFIX}:{tag(partition)}:s:{session_id}:state"


def session_mail(partition: int, session_id: str) -> str:
    return f"{PREFIX}:{tag(partition)}:s:{session_id}:mail"


def session_due(partition: int, session_id: str) -> str:
    """The pending mail a claim may take (``lifecycle.claimable``), each item under its message id.

    ``session_mail`` holds the rest of the session's pending mail: an item is in one of the two.
    (An older version kept only the id here, as ``1``, and every item in ``session_mail``.)"""
    return f"{PREFIX}:{tag(partition)}:s:{session_id}:due"


def wake_stream(partition: int) -> str:
    return f"{PREFIX}:{tag(partition)}:wakes"


def feed(partition: int) -> str:
    return f"{PREFIX}:{tag(partition)}:feed"


def projection_view(partition: int, name: str) -> str:
    return f"{PREFIX}:{tag(partition)}:proj:{name}:view"


def projection_checkpoint(partition: int, name: str) -> str:
    return f"{PREFIX}:{tag(partition)}:proj:{name}:checkpoint"


def partition_sessions(partition: int) -> str:
    return f"{PREFIX}:{tag(partition)}:sessions"


def tree_handles(partition: int, root_session_id: str) -> str:
    return f"{PREFIX}:{tag(partition)}:t:{root_session_id}:handles"


def tree_members(partition: int, root_session_id: str) -> str:
    return f"{PREFIX}:{tag(partition)}:t:{root_session_id}:members"


def tree_grants(partition: int, root_session_id: str) -> str:
    return f"{PREFIX}:{tag(partition)}:t:{root_session_id}:grants"


def session_idempotency(partition: int, session_id: str) -> str:
    """The sender's tool-call outcomes, one field per idempotency digest: kept, like the session's
    other keys, for as long as the session exists (no expiry)."""
    return f"{PREFIX}:{tag(partition)}:s:{session_id}:idem"


def session_prefix(partition: int) -> tuple[str, str, str]:
    """(prefix, events suffix, state suffix) of a session's keys, for scripts that find sessions themselves."""
    prefix, events_suffix = session_stream(partition, "\0").split("\0")
    state_suffix = session_snapshot(partition, "\0").split("\0")[1]
    return prefix, events_suffix, state_suffix


def approvals(partition: int) -> str:
    """Approval requests of the partition's trees: ``<id>`` the request, ``<id>:status`` its status."""
    return f"{PREFIX}:{tag(partition)}:approvals"


# Delivery as an obligation.
def due_index(partition: int) -> str:
    """Sorted set: session id -> the next time the delivery pump must look at it (derived from its stream)."""
    return f"{PREFIX}:{tag(partition)}:due"


def outbound_index(partition: int) -> str:
    """Hash: ``<message id>`` -> its sender's record (receipt or refusal), ``<id>:settled`` -> its settlement."""
    return f"{PREFIX}:{tag(partition)}:outbound"


def partition_drain(partition: int) -> str:
    """Draining: the service-wide drain flag, mirrored on each partition's slot, where the commit step
    can check it atomically with the append (the flag itself, ``service_drain``, lives in no tree's slot)."""
    return f"{PREFIX}:{tag(partition)}:drain"


def directory(session_id: str) -> str:
    return f"{PREFIX}:dir:{session_id}"


def command_stream(index: int) -> str:
    return f"{PREFIX}:cmd:{{c{index}}}"


def command_shard(route_session_id: str, command_streams: int) -> int:
    """The command stream (by index) of a send routed by ``route_session_id``: its sender's tree root, or the
    sender itself (``route_commands_by``)."""
    return zlib.crc32(route_session_id.encode()) % command_streams


def projection_members() -> str:
    """Sorted set: each running projection worker (``<host>-<pid>``) -> when it last said so (server time,
    ms). Read by ``replay``, which warns while one runs."""
    return f"{PREFIX}:projectors"


def worker_members() -> str:
    """Sorted set: each live worker (``"<command_streams> <consumer name>"``, ``members.entry``) -> when it
    last said so (server time, ms). The workers share the command streams out among its members
    (``consumers/ownership.py``)."""
    return f"{PREFIX}:workers"


def dead_letters() -> str:
    return f"{PREFIX}:cmd:dead"


def reply_list(client_id: str) -> str:
    return f"{PREFIX}:reply:{client_id}"


# A producer's answers live this long unread (one that gave up never reads its list again).
REPLY_TTL_S = 120


COMMAND_GROUP = "treemail-workers"
WAKE_GROUP = "treemail-hosts"
# interrupt_agent: interrupt triggers ride the wake streams; host runners read them in their own group.
INTERRUPT_GROUP = "treemail-interrupts"
# Each kind of trigger on a wake stream (its data's "kind") and the group that reads it.
TRIGGER_GROUPS = {"wake": WAKE_GROUP, "interrupt": INTERRUPT_GROUP}


def approval_notify(request_id: str) -> str:
    """Wakes a send waiting on this request at once; only a hint (waiting sends poll the status too)."""
    return f"{PREFIX}:approval-notify:{request_id}"


def access_token(digest: str) -> str:
    """A bearer token binding an MCP connection to one session: only its SHA-256 is ever stored."""
    return f"{PREFIX}:token:{digest}"
# Peer routes: the peer route index, source -> (name -> target session id). Only a lookup:
# the route itself is an event on the target's stream, checked under its etag by every send.
def peer_routes(source_kind: str, source: str) -> str:
    return f"{PREFIX}:peers:{source_kind}:{source}"


def peer_due(partition: int) -> str:
    """Sorted set: source session id -> when a peer driver must next look at its outbox (peer mail as an outbox)."""
    return f"{PREFIX}:{tag(partition)}:peerdue"


def peer_intent(partition: int, key_digest: str) -> str:
    """In the sender's partition: the target a peer tool call first went to, so its retry finds its record there."""
    return f"{PREFIX}:{tag(partition)}:peer-intent:{key_digest}"


# Draining: set while the whole service drains (a flag, not a stream: no session owns it).
def service_drain() -> str:
    return f"{PREFIX}:drain"
