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


def idempotency(partition: int, key_digest: str) -> str:
    return f"{PREFIX}:{tag(partition)}:idem:{key_digest}"


def approvals(partition: int) -> str:
    """Approval requests of the partition's trees: ``<id>`` the request, ``<id>:status`` its status."""
    return f"{PREFIX}:{tag(partition)}:approvals"


def directory(session_id: str) -> str:
    return f"{PREFIX}:dir:{session_id}"


def command_stream(index: int) -> str:
    return f"{PREFIX}:cmd:{{c{index}}}"


def dead_letters() -> str:
    return f"{PREFIX}:cmd:dead"


def reply_list(client_id: str) -> str:
    return f"{PREFIX}:reply:{client_id}"


COMMAND_GROUP = "treemail-workers"
WAKE_GROUP = "treemail-hosts"


def approval_notify(request_id: str) -> str:
    """Wakes a send waiting on this request at once; only a hint (waiting sends poll the status too)."""
    return f"{PREFIX}:approval-notify:{request_id}"


# Seed 002: set while the whole service drains (a flag, not a stream: no session owns it).
def service_drain() -> str:
    return f"{PREFIX}:drain"
