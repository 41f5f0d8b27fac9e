"""The capacity model BENCHMARKS.md prints: sends/s a cluster of M masters should decide, from the costs per
decision the cluster phase measured, and what runs out first.

What is measured (``scale_cluster``, each row's ``per_master``): the workers' core-us per decision, and each
master's core-us per decision with the command streams it holds and the decisions' script calls on it. From
these, by least squares over every master of every row, Valkey's cost splits into the part that follows the
sessions (each decision's commit lands on its session's master) and the part that follows the command
streams (reads and acknowledgements of the stream a command came on).

What is assumed, each a limit of its own:
- a master is one core (Valkey executes commands on one thread), a worker process one core;
- trees spread evenly over the partitions (crc32 of the root), and partitions and command streams over the
  masters as the slot plan places them (``treemail cluster-plan``, ``slotplan.quotas``): each master holds
  both within one of an even share, the extra streams on the masters without an extra partition first, so
  the busiest master is the costliest of those shares: at most ``partitions`` masters ever hold sessions, at
  most ``streams`` hold command streams;
- each command stream has one reader at a time, so there are at most ``streams`` useful workers;
- nothing else shares those cores: no hosts, projections or pumps, no network; every figure is at saturation
  (plan for about 70 % of it).
"""

import math
from dataclasses import dataclass

from treemail.adapters import slotplan

MASTERS = (3, 10, 30)


@dataclass(frozen=True)
class Costs:
    worker_us: float  # worker core-us per decision
    valkey_us: float  # all masters' core-us per decision
    stream_us: float  # of which follows the command streams (the rest follows the sessions)
    rows: int  # measurements the costs are the median of


@dataclass(frozen=True)
class Prediction:
    masters: int
    partitions: int
    streams: int
    workers: int
    rate: float  # decisions (sends) per second
    limit: str  # what runs out first


def _median(values: list[float]) -> float:
    values = sorted(values)
    mid = len(values) // 2
    return values[mid] if len(values) % 2 else (values[mid - 1] + values[mid]) / 2


def costs(rows: list[dict], commands: int, streams: int) -> Costs:
    """Medians over the cluster phase's rows (1, 2 and 4 workers), and the stream part of Valkey's cost fitted
    on every master: us_i = valkey_us * f_i + stream_us * (h_i - f_i), where f_i is the master's share of the
    script calls and h_i its share of the command streams (least squares for stream_us, kept within
    [0, valkey_us])."""
    worker = [1e6 * row["worker_cpu_s"] / commands for row in rows]
    valkey = [row["per_master"]["valkey_us_per_decision"] for row in rows]
    num = den = 0.0
    for row in rows:
        masters = row["per_master"]["masters"]
        calls = sum(m["script_calls"] for m in masters) or 1
        total = row["per_master"]["valkey_us_per_decision"]
        for m in masters:
            f, h = m["script_calls"] / calls, m["streams_held"] / streams
            num += (m["us_per_decision"] - total * f) * (h - f)
            den += (h - f) ** 2
    valkey_us = _median(valkey)
    stream_us = min(max(num / den if den else 0.0, 0.0), valkey_us)
    return Costs(_median(worker), valkey_us, stream_us, len(rows))


def predict(c: Costs, masters: int, partitions: int, streams: int) -> Prediction:
    """The rate the busiest master or the workers allow, whichever is lower, and the workers it takes."""
    session_us = c.valkey_us - c.stream_us
    held_p, held_s = slotplan.quotas(masters, partitions, streams)
    busiest = max(session_us * p / partitions + c.stream_us * s / streams for p, s in zip(held_p, held_s))
    by_valkey = 1e6 / busiest
    per_worker = 1e6 / c.worker_us
    by_workers = streams * per_worker
    rate = min(by_valkey, by_workers)
    if by_workers < by_valkey:
        limit = f"workers: {streams} command streams, one reader each"
    elif partitions < masters:
        limit = f"the busiest master; only {partitions} of {masters} masters hold sessions (partitions)"
    elif streams < masters and c.stream_us > session_us / partitions:
        limit = "the masters holding the command streams"
    else:
        limit = "the busiest master's core"
    return Prediction(masters, partitions, streams, math.ceil(rate / per_worker), rate, limit)


def sized(c: Costs, masters: int, partitions: int) -> Prediction:
    """The fewest command streams that reach the best rate these masters allow (up to the 1,024 allowed)."""
    best = max((predict(c, masters, partitions, s) for s in range(1, 1025)), key=lambda p: p.rate)
    return next(p for s in range(1, 1025) if (p := predict(c, masters, partitions, s)).rate >= best.rate * 0.99)


def model(rows: list[dict], commands: int, measured_streams: int, partitions: int, streams: int
          ) -> tuple[Costs, list[Prediction]]:
    """For each of 3, 10 and 30 masters: as configured (``partitions``, ``streams``: the defaults), then with
    partitions at least the masters and the command streams sized. ``rows`` ran ``commands`` over
    ``measured_streams`` command streams."""
    c = costs(rows, commands, measured_streams)
    out = []
    for m in MASTERS:
        out.append(predict(c, m, partitions, streams))
        out.append(sized(c, m, max(partitions, m)))
    return c, out


def markdown(c: Costs, predictions: list[Prediction]) -> str:
    lines = [
        f"Measured (medians of the {c.rows} cluster rows): a worker spends {c.worker_us:.0f} core-us per decision, "
        f"the masters {c.valkey_us:.0f} between them, of which {c.stream_us:.0f} follow the command streams and "
        f"{c.valkey_us - c.stream_us:.0f} the sessions.",
        "",
        "| masters | partitions | command streams | workers | predicted sends/s | what runs out first |",
        "|---|---|---|---|---|---|",
    ]
    for p in predictions:
        lines.append(f"| {p.masters} | {p.partitions} | {p.streams} | {p.workers} | {p.rate:,.0f} | {p.limit} |")
    return "\n".join(lines)
