"""Per-master figures of a cluster phase: each master's share of Valkey's CPU, the decisions' script calls on
it, and the cross-slot operations the masters refused.

Read straight from each master around the timed drain (``timed_drain``'s ``sample``):

- CPU: ``INFO cpu`` (``used_cpu_sys`` + ``used_cpu_user``: the whole server process, as /proc has it);
- what landed where: ``INFO commandstats`` (the script calls: each decision's commit is one, on its session's
  master) and which command streams each master holds (their slots);
- errors: ``INFO errorstats``. A multi-key command or a script whose keys hash to more than one slot is
  refused with ``CROSSSLOT`` and counted there, so a decision path that needed one would show up as
  ``errorstat_CROSSSLOT`` (and as failed decisions). ``probe_crossslot`` makes one such refusal on purpose
  before the run, to show the counter moves on this server.

A script may also reach keys it did not declare (the peers' list builds its members' keys from the tree's
hash tag): Valkey lets a script without flags reach another slot of its own master silently, so those are
not counted here; they stay on the declared key's slot because they share the tree's hash tag.
"""

import redis.asyncio as aioredis


def clients(ports: list[int]) -> list[aioredis.Redis]:
    return [aioredis.Redis(host="127.0.0.1", port=port) for port in ports]


async def sample(masters: list[aioredis.Redis]) -> list[dict]:
    """Each master's counters now: CPU seconds, error counts by kind, commands' calls."""
    out = []
    for master in masters:
        cpu = await master.info("cpu")
        errors = await master.info("errorstats")
        commands = await master.info("commandstats")
        out.append({
            "cpu_s": float(cpu["used_cpu_sys"]) + float(cpu["used_cpu_user"]),
            "errors": {name.removeprefix("errorstat_"): int(v["count"]) for name, v in errors.items()},
            "calls": {name.removeprefix("cmdstat_"): int(v["calls"]) for name, v in commands.items()},
        })
    return out


def _delta(after: dict, before: dict) -> dict:
    return {k: v - before.get(k, 0) for k, v in after.items() if v - before.get(k, 0)}


def summary(before: list[dict], after: list[dict], decisions: int, streams_held: list[int],
            partitions_held: list[int] | None = None) -> dict:
    """Per master: its share of the masters' CPU, core-us per decision, the command streams and partitions it
    holds, its script calls and errors over the run; over all of them, the cross-slot refusals per decision."""
    rows = []
    for index, (b, a, held) in enumerate(zip(before, after, streams_held)):
        calls = _delta(a["calls"], b["calls"])
        rows.append({
            "cpu_s": a["cpu_s"] - b["cpu_s"],
            "streams_held": held,
            **({"partitions_held": partitions_held[index]} if partitions_held is not None else {}),
            "script_calls": calls.get("evalsha", 0) + calls.get("eval", 0) + calls.get("fcall", 0),
            "errors": _delta(a["errors"], b["errors"]),
        })
    total = sum(r["cpu_s"] for r in rows) or 1e-9
    for r in rows:
        r["share"] = r["cpu_s"] / total
        r["us_per_decision"] = 1e6 * r["cpu_s"] / decisions
    crossslot = sum(r["errors"].get("CROSSSLOT", 0) for r in rows)
    return {
        "masters": rows,
        "valkey_us_per_decision": 1e6 * total / decisions,
        "max_share": max(r["share"] for r in rows),
        "crossslot": crossslot,
        "crossslot_per_decision": crossslot / decisions,
        "errors": sum(sum(r["errors"].values()) for r in rows),
    }


async def probe_crossslot(master: aioredis.Redis) -> int:
    """One command refused as cross-slot on purpose: how much ``errorstat_CROSSSLOT`` rose (1 if the count is
    a witness that would show a cross-slot operation)."""
    first, second = "{bench-a}probe", "{bench-b}probe"

    def count(stats: dict) -> int:
        return int(stats.get("errorstat_CROSSSLOT", {}).get("count", 0))

    before = count(await master.info("errorstats"))
    try:
        await master.execute_command("EVAL", "return 1", 2, first, second)
    except aioredis.ResponseError:
        pass
    return count(await master.info("errorstats")) - before
