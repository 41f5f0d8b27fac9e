"""Round trips of packed commands: on one server, on connections kept out of the pool.

redis-py's pipeline borrows a connection from the pool for every round trip
and returns it through a task of its own (``asyncio.shield``), under the
pool's condition and its observability hooks: about 60 us of CPU a round trip
on the benchmark machine, as much again as writing the commands and reading
their replies (BENCHMARKS.md). A worker deciding one
command per batch pays it once per command.

A lane is a connection taken from the pool once and kept for such round
trips. A round trip writes every command in one write and reads the replies
in order, as the pipeline does: a command the server refuses gives its error
in its place, and a lost connection is retried whole under the client's retry
policy, as the pipeline's is. A lane whose round trip was cut short (the
caller cancelled, the server went away) is disconnected, and reconnects on
its next use; so is a kept lane the server closed meanwhile (a restart), as
the pool checks a connection it lends.

On a cluster the same commands go through redis-py's cluster pipeline, which
routes each one to its node.
"""

from redis.asyncio import Redis
from redis.commands.core import HashCommands
from redis.exceptions import ConnectionError, ResponseError

# Connections kept between round trips; more at once come from the pool and go back to it.
KEPT = 4


def raise_refused(replies: list) -> list:
    """``replies``, once none of them is the server's refusal of its command; else the first refusal, raised,
    as a pipeline's ``execute`` raises it."""
    for reply in replies:
        if isinstance(reply, Exception):
            raise reply
    return replies


class CommandBatch(HashCommands):
    """The commands a step adds, in order: ``execute_command`` and the hash commands of a pipeline's API."""

    def __init__(self) -> None:
        self.commands: list[tuple] = []

    def execute_command(self, *args, **options) -> None:
        self.commands.append(args)


class Lanes:
    def __init__(self, client: Redis, kept: int = KEPT, cluster: bool = False) -> None:
        self.client = client
        self.kept = kept
        self.cluster = cluster
        self.idle: list = []

    async def run(self, commands: list[tuple]) -> list:
        """Every command's reply (or the server's error for it), in order, in one round trip (per node)."""
        if self.cluster:
            async with self.client.pipeline(transaction=False) as pipe:
                for args in commands:
                    pipe.execute_command(*args)
                return await pipe.execute(raise_on_error=False)
        if self.idle:
            connection = await self._ready(self.idle.pop())
        else:
            connection = await self.client.connection_pool.get_connection()
        try:
            return await connection.retry.call_with_retry(
                lambda: self._round_trip(connection, commands), lambda _error: connection.disconnect()
            )
        finally:
            # Kept even when cut short: a connection that fails or is cancelled while it writes or reads
            # disconnects itself (redis-py), so no reply of this round trip is left for the next one.
            await self._put_back(connection)

    @staticmethod
    async def _ready(connection):
        """A kept connection the server closed (a restart) is reopened, as the pool checks one it lends."""
        if connection.is_connected:
            try:
                stale = await connection.can_read()  # the server's close, or a reply nobody asked for
            except ConnectionError:
                stale = True
            if stale:
                await connection.disconnect(nowait=True)  # forced: it cannot time out and strand the lane
        return connection

    async def _round_trip(self, connection, commands: list[tuple]) -> list:
        await connection.send_packed_command(connection.pack_commands(commands))
        replies = []
        for args in commands:
            try:
                replies.append(await self.client.parse_response(connection, args[0]))
            except ResponseError as refused:
                replies.append(refused)
        return replies

    async def _put_back(self, connection) -> None:
        if len(self.idle) < self.kept:
            self.idle.append(connection)
        else:
            await self.client.connection_pool.release(connection)
