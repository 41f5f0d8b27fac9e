"""bench.report judges treemail against the records' floor measured in the same run, each target on its own side."""

from bench import report
from bench.sizes import QUICK


def _verdicts(rows) -> dict[str, tuple[str, str]]:
    return {label: (value, verdict) for label, value, _, verdict in rows}


def test_the_floor_rows_judge_treemail_against_the_floor():
    commands = QUICK.commands
    raw = {"rate": 20_000.0, "worker_cpu_s": 27e-6 * commands, "valkey_cpu_s": 8e-6 * commands}
    flo = {"rate": 10_000.0, "seconds": 0.5, "worker_cpu_s": 54e-6 * commands, "valkey_cpu_s": 40e-6 * commands}
    one = {"rate": 5_000.0, "worker_cpu_s": 108e-6 * commands, "valkey_cpu_s": 48e-6 * commands}
    rows = _verdicts(report.floor_rows(flo, raw, one, QUICK))
    assert rows["floor / raw"] == ("0.50", "")
    assert rows["treemail / floor"] == ("0.50", "NOT met")  # at least 0.8
    assert rows["worker CPU per decision, treemail / floor"] == ("2.00", "NOT met")  # at most 1.4
    assert rows["Valkey CPU per decision, treemail / floor"] == ("1.20", "met")  # at most 1.3
    faster = _verdicts(report.floor_rows(flo, raw, {**one, "rate": 8_000.0}, QUICK))
    assert faster["treemail / floor"] == ("0.80", "met")


def test_the_memory_rows_judge_the_floor_against_a_bare_xadd_and_treemail_against_the_floor():
    rows = _verdicts(report.floor_memory_rows({"bytes_per_message": 600.0, "bare_xadd_bytes": 200.0},
                                              {"bytes_per_message": 1200.0}))
    assert rows["floor / bare XADD"] == ("3.00", "NOT met")  # at most 2.3
    assert rows["memory treemail / floor"] == ("2.00", "NOT met")  # at most 1.3
    rows = _verdicts(report.floor_memory_rows({"bytes_per_message": 460.0, "bare_xadd_bytes": 200.0},
                                              {"bytes_per_message": 598.0}))
    assert rows["floor / bare XADD"] == ("2.30", "met")
    assert rows["memory treemail / floor"] == ("1.30", "met")


def test_the_round_trip_is_judged_against_the_raw_round_trip_of_the_same_run():
    lat = {"target_rate": 2000, "achieved_rate": 1990.0, "ok": 100, "failed": 0, "p50_ms": 1.5, "p99_ms": 16.0,
           "rounds": [{"p50_ms": 1.5, "p99_ms": 16.0}], "raw": {"p50_ms": 1.0, "p99_ms": 6.0}}
    rows = _verdicts(report.round_trip_rows(lat))
    assert rows["send round trip p50 at 2,000/s"] == ("1.50 ms", "met")  # at most x1.5
    assert rows["send round trip p99 at 2,000/s"] == ("16.00 ms", "NOT met")  # at most x2.5


def test_the_decision_row_sets_the_decision_alone_beside_the_floor_and_the_whole_worker():
    commands = QUICK.commands
    flo = {"worker_cpu_s": 50e-6 * commands}
    one = {"worker_cpu_s": 200e-6 * commands}
    dec = {"us_per_decision": 100.0, "us_by_stage": {"parse": 10.0, "decide": 40.0, "plan and lay out": 50.0}}
    [(label, value, detail, _)] = report.decision_rows(dec, flo, one, QUICK)
    assert (label, value) == ("worker CPU per decision, deciding alone (no I/O)", "100 us")
    assert detail == ("parse 10, decide 40, plan and lay out 50 us; x2.00 the floor's whole worker CPU per command, "
                      "0.50 of treemail's")
