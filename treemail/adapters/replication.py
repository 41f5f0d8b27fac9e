"""The replicated profile: an append succeeds only once ``min_replicas`` replicas of the primary that took it
have it, so a failover to one of them keeps every acknowledged step.

WAIT counts the replicas that acknowledged every write made *on its own connection* before it. So WAIT
must follow the writes on the connection that carried them: on one server the store's round trip ends
with it (``EventStore.add_durability_wait``); on a cluster each primary's share of a round trip is sent
with a WAIT of its own on one connection to that primary (``run_waited``), and a share the primary
refused because its slots moved (a failover: MOVED, CLUSTERDOWN, a lost or silent connection) is sent
again, with its WAIT, to the slots' new primary once the slot map is refreshed. Sending a commit again is
safe: its etag check answers ``conflict`` for a step already applied, and the service decides it again
against the idempotency record.

When the replicas do not confirm within ``replica_timeout_ms``, the append is on the primary but may not
survive its failure: ``NotReplicated`` says the outcome is unknown. The same tool call, retried, is
answered from its idempotency record (the append was kept) or decided once more (it was lost with the
primary); never appended twice.
"""

import asyncio

from redis.asyncio.cluster import PipelineCommand
from redis.exceptions import (
    AskError, ClusterDownError, ConnectionError, MovedError, NoPermissionError, ReadOnlyError, RedisClusterException,
    TryAgainError,
)
from redis.exceptions import TimeoutError as RedisTimeoutError

from ..domain.errors import Code, RedisUnavailable, TreemailError
from ..domain.results import error_result
from .config import ServiceConfig

# A primary's share of a round trip is sent this many times at most while the cluster fails over; with
# the backoff below that spans a failover of a few seconds (cluster-node-timeout plus an election).
ROUNDS = 40
BACKOFF_S = (0.05, 0.1, 0.2, 0.4, 0.5)
# On top of the WAIT's own bound: a primary that does not answer within it is taken for gone (a paused
# process, a partition) and its share goes to the slots' next owner.
SILENT_MARGIN_S = 2.0
# The slots of these refusals have another owner, or will soon: the share is sent again after a refresh.
MOVED_ON = (MovedError, AskError, TryAgainError, ClusterDownError, ReadOnlyError)


class NotReplicated(TreemailError):
    """The append was made on a primary, but not confirmed on ``min_replicas`` replicas in time."""

    code = Code.NOT_REPLICATED

    def __init__(self, confirmed: int, config: ServiceConfig) -> None:
        super().__init__(
            f"{self.code.value}: the step was written but only {confirmed} of the {config.min_replicas} "
            f"replica(s) required confirmed it within {config.replica_timeout_ms} ms; it may not survive a "
            "failover. Retrying the same call is safe: it is answered from its first outcome, or decided once."
        )
        self.confirmed = confirmed


def not_replicated_result(error: NotReplicated) -> dict:
    """What a send's caller is answered: the outcome is unknown, and the same tool call resolves it."""
    return error_result(
        Code.NOT_REPLICATED.value,
        f"the message was written but its replicas did not confirm it in time ({error.confirmed} of the "
        "required replicas did); it may or may not have been accepted. Retrying this same tool call is "
        "safe: it returns the original message_id if the message was kept, and it is delivered at most once.",
    )


def wait_command(config: ServiceConfig) -> tuple:
    return ("WAIT", config.min_replicas, config.replica_timeout_ms)


def require_confirmed(confirmed, config: ServiceConfig) -> None:
    if isinstance(confirmed, Exception):
        raise confirmed
    if int(confirmed) < config.min_replicas:
        raise NotReplicated(int(confirmed), config)


async def require_replicated_server(client, config: ServiceConfig) -> None:
    """The replicated profile needs every primary to have ``min_replicas`` replicas connected now: with
    fewer, every step would wait ``replica_timeout_ms`` and fail. Says which primary lacks them."""
    if config.cluster:
        primaries = [(f"{node.host}:{node.port}", node) for node in client.get_primaries()]
    else:
        primaries = [("the server", None)]
    for name, node in primaries:
        try:
            if node is None:
                info = await client.info("replication")
            else:
                info = await client.info("replication", target_nodes=node)
        except NoPermissionError:
            raise RedisUnavailable(
                "profile = \"replicated\" checks the replicas of every primary with INFO replication, which "
                "this user may not run: grant it (ACL SETUSER <user> +info) or use profile = \"fast\""
            ) from None
        if isinstance(info, dict) and node is not None and "connected_slaves" not in info:
            info = next(iter(info.values()), {})
        connected = online_replicas(info)
        role = info.get("role")
        if role not in (None, "master", b"master"):
            raise RedisUnavailable(f"profile = \"replicated\": {name} is a replica, not a primary; point "
                                   "REDIS_URL at the primary")
        if connected < config.min_replicas:
            raise RedisUnavailable(
                f"profile = \"replicated\" needs min_replicas = {config.min_replicas} replica(s) connected to "
                f"every primary; {name} has {connected} in sync. Start replicas (`treemail cluster --replicas 1`), "
                "lower min_replicas, or use profile = \"fast\" or \"durable\""
            )


def online_replicas(info: dict) -> int:
    """Replicas past their first full sync (``INFO replication``): only these acknowledge offsets to WAIT."""
    count = int(info.get("connected_slaves", 0))
    links = [info.get(f"slave{i}") for i in range(count)]
    return sum(1 for link in links if isinstance(link, dict) and _text(link.get("state")) == "online")


def _text(value) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


async def run_waited(client, commands: list[tuple], config: ServiceConfig) -> list:
    """Every command's reply (or the server's refusal of it), in order, each primary's share followed by
    a WAIT on the same connection; raises ``NotReplicated`` when a primary that applied some of its share
    could not confirm it on ``min_replicas`` replicas. ``client``: a redis-py asyncio ``RedisCluster``."""
    replies: list = [None] * len(commands)
    todo = list(range(len(commands)))
    for attempt in range(ROUNDS):
        if attempt:
            await asyncio.sleep(BACKOFF_S[min(attempt - 1, len(BACKOFF_S) - 1)])
        if client._initialize:
            try:
                await client.initialize()
            except (ConnectionError, RedisTimeoutError, OSError, ClusterDownError, RedisClusterException):
                continue  # no node answered with a slot map yet: the next round asks again
        shares: dict[str, tuple] = {}
        for index in todo:
            slot = await client._determine_slot(*commands[index])
            node = client.nodes_manager.get_node_from_slot(slot)
            shares.setdefault(node.name, (node, []))[1].append(index)
        results = await asyncio.gather(*(
            _share(node, [commands[i] for i in indexes], config) for node, indexes in shares.values()
        ), return_exceptions=True)
        again: list[int] = []
        for (node, indexes), result in zip(shares.values(), results):
            if isinstance(result, (ConnectionError, RedisTimeoutError, OSError, TimeoutError)):
                # The primary is gone or silent: what its share did is unknown; sent again, checked by etag.
                await _forget(client, node)
                again += indexes
                continue
            if isinstance(result, BaseException):
                raise result
            share_replies, confirmed = result
            applied = False
            for index, reply in zip(indexes, share_replies):
                if isinstance(reply, MovedError):
                    await client.nodes_manager.move_slot(reply)
                    again.append(index)
                elif isinstance(reply, MOVED_ON):
                    client._initialize = True
                    again.append(index)
                else:
                    replies[index] = reply
                    applied = True
            if applied:
                require_confirmed(confirmed, config)
        if not again:
            return replies
        todo = sorted(again)
    raise ConnectionError(f"the cluster did not settle on a primary for {len(todo)} command(s) in time")


async def _share(node, commands: list[tuple], config: ServiceConfig) -> tuple[list, object]:
    """One primary's commands and then WAIT, on one of its connections, in one round trip."""
    stack = [PipelineCommand(i, *args) for i, args in enumerate([*commands, wait_command(config)])]
    async with asyncio.timeout(config.replica_timeout_ms / 1000 + SILENT_MARGIN_S):
        await node.execute_pipeline(stack)
    results = [command.result for command in stack]
    lost = next((r for r in results if isinstance(r, (ConnectionError, RedisTimeoutError))), None)
    if lost is not None:
        raise lost
    return results[:-1], results[-1]


async def _forget(client, node) -> None:
    """A primary that failed or went silent: its connections are dropped (one cut short mid-reply must not
    be reused) and the slot map is read again, from the other nodes first."""
    node.update_active_connections_for_reconnect()
    await node.disconnect_free_connections()
    client.nodes_manager.move_node_to_end_of_cached_nodes(node.name)
    client._initialize = True
