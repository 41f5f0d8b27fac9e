"""`make test`'s two suites: the whole suite on one Valkey, then the cluster suite on a 3-master Valkey
Cluster. Both run whatever the first one's result, and the last lines name each suite's result, so a red
single-server suite never hides whether the cluster suite passed (or that it never ran).

Usage: python -m tests.suites [--jobs N]   (N test processes for the single-server suite; 1 for none)
"""

import argparse
import os
import re
import subprocess
import sys
import time
from dataclasses import dataclass

# pytest's closing line in -q mode: "3 failed, 1539 passed, 2 skipped in 340.12s (0:05:40)".
SUMMARY = re.compile(r"^=*\s*(?P<counts>(\d+ [a-z]+(, )?)+) in [\d.]+s")
COUNT = re.compile(r"(\d+) ([a-z]+)")


@dataclass(frozen=True)
class Suite:
    name: str
    args: tuple[str, ...]
    env: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True)
class Outcome:
    suite: str
    exit_code: int
    counts: dict[str, int]
    seconds: float

    @property
    def passed(self) -> int:
        return self.counts.get("passed", 0)

    @property
    def failed(self) -> int:
        # Errors in set-up or tear-down are failures too; a suite that ended before its summary is one.
        failed = self.counts.get("failed", 0) + self.counts.get("error", 0) + self.counts.get("errors", 0)
        return failed or (1 if self.exit_code != 0 else 0)

    def line(self) -> str:
        counts = ", ".join(f"{n} {word}" for word, n in self.counts.items()) or "no summary"
        verdict = "passed" if self.exit_code == 0 else f"FAILED (exit {self.exit_code})"
        return f"make test: {self.suite}: {verdict}: {counts} in {self.seconds:.0f} s"


def counts_of(summary: str) -> dict[str, int]:
    """{"failed": 3, "passed": 1539, ...} from pytest's closing line, in its order."""
    match = SUMMARY.match(summary.strip())
    if not match:
        return {}
    return {word: int(n) for n, word in COUNT.findall(match.group("counts"))}


def suites(jobs: int) -> list[Suite]:
    shared_out = ("-n", str(jobs), "--dist", "loadgroup") if jobs > 1 else ()
    return [
        Suite("single server", ("-q", "-m", "not soak", *shared_out)),
        # Each test process starts a 3-master cluster of its own (the `valkey` fixture), as each starts its
        # own server above: the tests mostly wait on servers and workers, so two processes overlap well.
        Suite("cluster", ("-q", "-m", "cluster", *shared_out, "tests/integration"),
              (("TREEMAIL_TEST_BACKEND", "cluster"),)),
    ]


def run(suite: Suite) -> Outcome:
    """Runs one suite, its output passed through as it comes (unbuffered: pytest writing to a pipe would
    otherwise show its progress in 8 KB chunks); its result from pytest's closing line."""
    started = time.monotonic()
    summary = ""
    command = [sys.executable, "-m", "pytest", *suite.args]
    with subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1,
                          env={**os.environ, "PYTHONUNBUFFERED": "1", **dict(suite.env)}) as process:
        for line in process.stdout:
            sys.stdout.write(line)
            sys.stdout.flush()
            if SUMMARY.match(line.strip()):
                summary = line
    return Outcome(suite.name, process.returncode, counts_of(summary), time.monotonic() - started)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=2)
    options = parser.parse_args(argv)
    outcomes = []
    for suite in suites(options.jobs):
        print(f"make test: {suite.name} suite", flush=True)
        outcomes.append(run(suite))
    print()
    for outcome in outcomes:
        print(outcome.line())
    # The plain closing line: every suite's passes and failures added up.
    print(f"total: {sum(o.passed for o in outcomes)} passed, {sum(o.failed for o in outcomes)} failed")
    return 0 if all(o.exit_code == 0 for o in outcomes) else 1


if __name__ == "__main__":
    sys.exit(main())
