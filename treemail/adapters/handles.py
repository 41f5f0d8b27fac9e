"""Which sessions a handle names, across every tree: for people at the CLI, never for a send.

A send resolves a handle inside the sender's tree only. A person
typing ``treemail history explore_1a2b3c4d`` has no tree in hand, so every
tree's handle table is asked; handles are unique per tree, not globally, so
the answer may be several sessions and the caller must say so.
"""

from redis.asyncio import Redis

from . import directory, keys


async def sessions_with_handle(redis: Redis, partitions: int, handle: str) -> list[str]:
    """Session ids named ``handle`` in any tree, found in one pipelined round trip per partition.

    Only a root has a handle table (keyed by the root's id), so asking every
    session of the partition for one finds each tree's table without an index
    of roots; a session that is not a root answers nil.
    """
    found: list[str] = []
    for partition in range(partitions):
        members = await directory.registered(redis, partition)
        if not members:
            continue
        async with redis.pipeline(transaction=False) as pipe:
            for session_id in members:
                pipe.hget(keys.tree_handles(partition, session_id), handle)
            owners = await pipe.execute()
        found.extend(owner.decode() for owner in owners if owner is not None)
    return sorted(set(found))
