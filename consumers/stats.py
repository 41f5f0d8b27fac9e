"""What a worker reports to Prometheus: per batch on the hot path, per interval off it.

Every worker reports the same group-wide values for the polled gauges (so
dashboards take ``max``, not ``sum``, across workers).
"""

from collections import Counter

from treemail.adapters import keys, members, metrics
from treemail.adapters.config import ServiceConfig

from .entries import text

# A live worker polls every 100 ms, and a dead one stays in XINFO CONSUMERS until
# deleted. One idle for reclaim_idle_ms is treated as dead by reclaim (its commands
# are taken over), so it is not counted as live either; the floor absorbs a busy host.
MIN_LIVE_CONSUMER_IDLE_MS = 2_000


def live_consumer_idle_ms(config: ServiceConfig) -> int:
    return max(config.reclaim_idle_ms, MIN_LIVE_CONSUMER_IDLE_MS)


async def live_readers(redis, stream: str, config: ServiceConfig, besides: str = "") -> int:
    """How many live consumers of the workers' group read ``stream``, not counting the one named ``besides``."""
    consumers = await redis.xinfo_consumers(stream, keys.COMMAND_GROUP)
    return sum(1 for c in consumers if c["idle"] < live_consumer_idle_ms(config) and text(c["name"]) != besides)


def outcome_label(outcome: dict) -> str:
    """The bounded ``outcome`` label of one decision: ok, approval_pending or the error code."""
    if "ok" in outcome:
        return "ok"
    if "approval" in outcome:
        return "approval_pending"
    if "error" in outcome:
        return outcome["error"]["code"]
    return "unknown"


def record_batch(commands, outcomes: dict[str, dict], elapsed: float) -> None:
    # Every command of a batch waited for the whole batch, so each observes its wall time.
    metrics.BATCH_SIZE.observe(len(commands))
    counted = Counter(outcome_label(outcomes[command.command_id]) for command in commands)
    for label, count in counted.items():  # one labelled child looked up per outcome, not per command
        metrics.SENDS.labels(label).inc(count)
    for _ in commands:
        metrics.DECISION_SECONDS.observe(elapsed)


async def refresh_stats(redis, config: ServiceConfig) -> None:
    """Set the group and approval gauges from the server (the worker's periodic task calls this)."""
    for index in range(config.command_streams):
        stream = keys.command_stream(index)
        for group in await redis.xinfo_groups(stream):
            if text(group["name"]) != keys.COMMAND_GROUP:
                continue
            # lag is nil when the server cannot compute it (entries deleted); keep the last value.
            if group.get("lag") is not None:
                metrics.COMMAND_BACKLOG.labels(stream).set(group["lag"])
            metrics.COMMAND_PENDING.labels(stream).set(group["pending"])
        metrics.WORKER_CONSUMERS.labels(stream).set(await live_readers(redis, stream, config))
    metrics.WORKERS_LIVE.set(len(await members.live(redis, config.worker_timeout_ms)))
    pending = 0
    for partition in range(config.partitions):
        statuses = await redis.hvals(keys.approvals(partition))
        pending += sum(1 for s in statuses if s == b"pending")
    metrics.APPROVALS_PENDING.set(pending)


def server_unreachable(config: ServiceConfig) -> None:
    """No worker can read while the server is gone: the live-worker gauge must say so, not keep its last value.

    The backlog and pending counts live on the server, so nobody knows them now: they are removed (absent
    from the scrape, so a panel shows a gap and ``absent()`` can alert) rather than kept at a value, 0 or
    the last, that would claim the queue is known. The next refresh that reaches the server sets them again."""
    for index in range(config.command_streams):
        metrics.WORKER_CONSUMERS.labels(keys.command_stream(index)).set(0)
    metrics.WORKERS_LIVE.set(0)
    metrics.COMMAND_BACKLOG.clear()
    metrics.COMMAND_PENDING.clear()
