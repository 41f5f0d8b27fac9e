"""Alternating runs of benchmark phases for two commits: how a change is judged on a machine that drifts.

    python -m bench.ab BEFORE AFTER [--only one,latency,latency_low] [--rounds 5]

On this machine a figure moves by 10-20 % from one minute to the next, more than most single changes
gain, so two runs minutes apart say little. Here both commits run in turn, round after round, in one
detached worktree (its own virtualenv, made once with `make install`): each round runs BEFORE and AFTER
back to back, the order swapped every round, so both see the same drift. For each figure it prints the
pairs, the two medians and in how many pairs AFTER came out better. Nothing is written to BENCHMARKS.md.
"""

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

# (phase, label, path into the phase's results (keys, or the index of a row), whether lower is better)
FIGURES = (
    ("one", "1 worker: worker CPU-s per run", ("worker_cpu_s",), True),
    ("one", "1 worker: Valkey CPU-s per run", ("valkey_cpu_s",), True),
    ("one", "1 worker: commands/s", ("rate",), False),
    ("decision", "deciding alone: us per decision", ("us_per_decision",), True),
    ("durable", "1 worker, durable: commands/s", ("rate",), False),
    ("two", "2 workers: commands/s", ("rate",), False),
    ("memory", "memory: bytes per message", ("bytes_per_message",), True),
    ("floor", "records' floor: worker CPU-s per run", ("worker_cpu_s",), True),
    ("latency", "half capacity: p50 ms", ("p50_ms",), True),
    ("latency", "half capacity: p99 ms", ("p99_ms",), True),
    ("latency", "half capacity: host CPU us per send", ("host_cpu_us_per_send",), True),
    ("latency", "half capacity: worker CPU us per send", ("worker_cpu_us_per_send",), True),
    ("latency_fixed", "2,000/s: p50 ms", ("p50_ms",), True),
    ("latency_fixed", "2,000/s: p99 ms", ("p99_ms",), True),
    ("latency_low", "500/s: p50 ms", ("p50_ms",), True),
    ("latency_low", "500/s: worker CPU us per send", ("worker_cpu_us_per_send",), True),
    ("replay", "replay: events/s", ("replay_rate",), False),
    ("scale_single", "one Valkey, 1 worker: commands/s", (0, "rate"), False),
    ("scale_single", "one Valkey, 2 workers: commands/s", (1, "rate"), False),
    ("scale_single", "one Valkey, 4 workers: commands/s", (2, "rate"), False),
    ("scale_single", "one Valkey, 2 workers: worker CPU-s", (1, "worker_cpu_s"), True),
    ("routing", "both ways, 2 workers, by tree: commands/s", ("by_tree", "rate"), False),
    ("mcp", "MCP send / empty tool", ("send_over_noop",), False),
    ("mcp", "MCP send / empty tool, by CPU", ("send_over_noop_by_cpu",), False),
    ("mcp", "MCP send decided by its server / empty tool", ("send_deciding_over_noop",), False),
    ("mcp", "MCP send decided by its server / empty tool, by CPU", ("send_deciding_over_noop_by_cpu",), False),
)


class AbError(Exception):
    pass


@dataclass(frozen=True)
class Compared:
    label: str
    pairs: list[tuple[float, float]]
    lower_is_better: bool

    @property
    def medians(self) -> tuple[float, float]:
        return statistics.median(a for a, _ in self.pairs), statistics.median(b for _, b in self.pairs)

    @property
    def better(self) -> int:
        """In how many pairs AFTER came out better than BEFORE."""
        return sum((b < a) if self.lower_is_better else (b > a) for a, b in self.pairs)

    def line(self) -> str:
        before, after = self.medians
        change = (after - before) / before * 100 if before else float("nan")
        pairs = ", ".join(f"{a:,.4g} / {b:,.4g}" for a, b in self.pairs)
        return (f"{self.label:34s} median {before:,.4g} -> {after:,.4g} ({change:+.1f} %), better in "
                f"{self.better} of {len(self.pairs)} pairs: {pairs}")


def _figure(results: dict, phase: str, path: tuple[str | int, ...]) -> float | None:
    value = results.get(phase)
    for key in path:
        if isinstance(value, dict):
            value = value.get(key)
        elif isinstance(value, list) and isinstance(key, int) and key < len(value):
            value = value[key]  # the scale-out phases report one row per worker count
        else:
            value = None
    return float(value) if isinstance(value, (int, float)) else None


def compare(before: list[dict], after: list[dict]) -> list[Compared]:
    """Round by round results of the two commits -> each figure both reported, as pairs."""
    out = []
    for phase, label, path, lower_is_better in FIGURES:
        pairs = [(a, b) for a, b in ((_figure(x, phase, path), _figure(y, phase, path)) for x, y in zip(before, after))
                 if a is not None and b is not None]
        if pairs:
            out.append(Compared(label, pairs, lower_is_better))
    return out


def results_of(stdout: str) -> dict:
    """The results `python -m bench.run --only ...` prints last, as one JSON object, after its log lines."""
    lines = stdout.splitlines()
    try:
        start = max(i for i, line in enumerate(lines) if line == "{")
    except ValueError:
        raise AbError("the benchmark printed no results") from None
    return json.loads("\n".join(lines[start:]))


def _git(*args: str, cwd: Path = ROOT) -> str:
    done = subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True)
    if done.returncode != 0:
        raise AbError(f"git {' '.join(args)}: {done.stderr.strip().splitlines()[-1] if done.stderr.strip() else 'failed'}")
    return done.stdout.strip()


def commit_of(revision: str) -> str:
    try:
        return _git("rev-parse", "--verify", "--quiet", f"{revision}^{{commit}}")
    except AbError:
        raise AbError(f"no commit {revision!r} in {ROOT}") from None


def run_phases(worktree: Path, commit: str, only: str) -> dict:
    _git("checkout", "--quiet", "--detach", commit, cwd=worktree)
    done = subprocess.run([str(worktree / ".venv" / "bin" / "python"), "-m", "bench.run", "--only", only],
                          cwd=worktree, capture_output=True, text=True)
    if done.returncode != 0:
        tail = (done.stderr or done.stdout).strip().splitlines()[-1:] or ["no output"]
        raise AbError(f"the benchmark failed at {commit[:10]}: {tail[0]}")
    return results_of(done.stdout)


def alternate(worktree: Path, before: str, after: str, only: str, rounds: int) -> dict[str, list[dict]]:
    """Each commit's results, round by round, from one worktree made (and removed) here."""
    _git("worktree", "add", "--quiet", "--detach", str(worktree), before)
    try:
        subprocess.run(["make", "install"], cwd=worktree, check=True, capture_output=True)
        runs: dict[str, list[dict]] = {before: [], after: []}
        for round_ in range(rounds):
            for commit in (before, after) if round_ % 2 == 0 else (after, before):
                runs[commit].append(run_phases(worktree, commit, only))
            print(f"round {round_ + 1} of {rounds} done", file=sys.stderr, flush=True)
        return runs
    finally:
        _git("worktree", "remove", "--force", str(worktree))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="bench.ab", description=__doc__.splitlines()[0])
    parser.add_argument("before")
    parser.add_argument("after")
    parser.add_argument("--only", default="one,latency,latency_low", help="bench.run phases (default: %(default)s)")
    parser.add_argument("--rounds", type=int, default=5, help="pairs of runs (default: %(default)s)")
    args = parser.parse_args(argv)
    if args.rounds < 1:
        parser.error("--rounds must be at least 1")
    try:
        before, after = commit_of(args.before), commit_of(args.after)
        if before == after:
            raise AbError(f"{args.before} and {args.after} are the same commit ({before[:10]}): nothing to compare")
        with tempfile.TemporaryDirectory(prefix="treemail-ab-") as scratch:
            runs = alternate(Path(scratch) / "tree", before, after, args.only, args.rounds)
    except AbError as exc:
        print(f"bench.ab: error: {exc}", file=sys.stderr)
        return 2
    except subprocess.CalledProcessError:
        print("bench.ab: error: `make install` failed in the worktree", file=sys.stderr)
        return 2
    print(f"{args.before} ({before[:10]}) -> {args.after} ({after[:10]}), {args.rounds} alternating pairs")
    for row in compare(runs[before], runs[after]):
        print(row.line())
    return 0


if __name__ == "__main__":
    sys.exit(main())
