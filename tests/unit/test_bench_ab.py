"""bench.ab: alternating runs of two commits, summarised per figure (the pure parts; the runs are `make bench`'s)."""

import pytest

from bench import ab


def results(worker_cpu: float, rate: float, p50: float | None = None) -> dict:
    out = {"one": {"worker_cpu_s": worker_cpu, "rate": rate, "outcomes": {"ok": 100000}}}
    if p50 is not None:
        out["latency"] = {"p50_ms": p50, "raw": {"p50_ms": 0.5}}
    return out


def test_each_figure_is_compared_pair_by_pair_with_its_own_sense_of_better():
    before = [results(15.4, 4500, 2.0), results(16.0, 4400, 1.8), results(15.0, 4700)]
    after = [results(14.8, 4600, 1.7), results(15.1, 4650, 1.9), results(15.2, 4600)]
    rows = {row.label: row for row in ab.compare(before, after)}
    cpu = rows["1 worker: worker CPU-s per run"]
    assert cpu.pairs == [(15.4, 14.8), (16.0, 15.1), (15.0, 15.2)]
    assert cpu.medians == (15.4, 15.1) and cpu.better == 2  # lower is better
    rate = rows["1 worker: commands/s"]
    assert rate.better == 2  # higher is better: 4,600 > 4,500 and 4,650 > 4,400, not 4,600 < 4,700
    # A figure only some rounds report is compared over those; one no round reports is left out.
    assert rows["half capacity: p50 ms"].pairs == [(2.0, 1.7), (1.8, 1.9)]
    assert "memory: bytes per message" not in rows
    assert "better in 2 of 3 pairs" in cpu.line() and "(-1.9 %)" in cpu.line()


def test_a_figure_of_a_phase_that_reports_rows_is_read_from_its_row():
    def scale(*rates: float) -> dict:
        return {"scale_single": [{"workers": 2 ** n, "rate": rate} for n, rate in enumerate(rates)]}

    rows = {row.label: row for row in ab.compare([scale(9000, 7000, 4000), scale(9100)],
                                                 [scale(9050, 10500, 10000), scale(9000)])}
    assert rows["one Valkey, 1 worker: commands/s"].pairs == [(9000, 9050), (9100, 9000)]
    assert rows["one Valkey, 2 workers: commands/s"].pairs == [(7000, 10500)]  # the second round has no such row
    assert rows["one Valkey, 4 workers: commands/s"].better == 1


def test_the_results_are_the_json_the_benchmark_prints_after_its_log_lines():
    stdout = "[bench 09:00:00] phase 1: one treemail worker process\n[bench 09:00:20]   1 worker(s): ...\n" \
             '{\n "one": {\n  "rate": 4847.2\n }\n}\n'
    assert ab.results_of(stdout) == {"one": {"rate": 4847.2}}
    with pytest.raises(ab.AbError, match="printed no results"):
        ab.results_of("[bench 09:00:00] Valkey at redis://...\n")


def test_an_unknown_revision_is_a_one_line_error(capsys):
    assert ab.main(["no-such-revision-anywhere", "HEAD", "--rounds", "1"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["bench.ab: error: no commit 'no-such-revision-anywhere' in " + str(ab.ROOT)]


def test_the_same_commit_twice_is_a_one_line_error(capsys):
    assert ab.main(["HEAD", "HEAD", "--rounds", "1"]) == 2
    [line] = capsys.readouterr().err.strip().splitlines()
    assert line.startswith("bench.ab: error: HEAD and HEAD are the same commit (") and "nothing to compare" in line
