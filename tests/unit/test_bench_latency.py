"""bench.latency.pooled: the latency rows' figures over several rounds (no server)."""

import math

from bench.latency import pooled


def _round(latencies_ms: list[float], *, failures=(), elapsed=1.0, host_cpu=0.1, wakeups=None) -> dict:
    return {"latencies": [x / 1000 for x in latencies_ms], "failures": list(failures), "lateness": [0.0],
            "elapsed": elapsed, "sends": len(latencies_ms) + len(failures), "host_cpu": host_cpu,
            "wakeups": len(latencies_ms) if wakeups is None else wakeups}


def test_percentiles_are_over_every_send_of_the_rounds_and_each_round_keeps_its_own():
    quick = _round([1.0] * 99)
    slow = _round([1.0] * 49 + [9.0] * 50)  # a bad round: a median of rounds would drop it
    figures = pooled([quick, slow, quick], ("host_cpu",))
    assert figures["p50_ms"] == 1.0
    assert math.isclose(figures["p99_ms"], 9.0)  # 50 of 297 sends took 9 ms
    assert [r["p50_ms"] for r in figures["rounds"]] == [1.0, 9.0, 1.0]
    assert figures["sends"] == figures["ok"] == 297


def test_cpu_and_rate_are_per_send_over_all_rounds_and_failures_are_counted():
    one = _round([1.0] * 10, elapsed=1.0, host_cpu=0.001)
    two = _round([1.0] * 10, failures=[{"error": {"code": "x"}}] * 10, elapsed=3.0, host_cpu=0.003, wakeups=5)
    figures = pooled([one, two], ("host_cpu",))
    assert math.isclose(figures["host_cpu_us_per_send"], 0.004 / 30 * 1e6)
    assert math.isclose(figures["achieved_rate"], 30 / 4.0)
    assert figures["failed"] == 10 and figures["first_failure"] == [{"error": {"code": "x"}}]
    assert math.isclose(figures["answers_per_listener_wakeup"], 30 / 15)


def test_the_round_trip_is_paced_at_half_of_one_workers_capacity_in_the_same_run():
    from bench.latency import paced_rate

    rate, basis = paced_rate({"rate": 4972.4}, 2000)
    assert rate == 2480 and "4,972 commands/s" in basis  # half, rounded down to tens
    assert paced_rate({"rate": 2372.0}, 2000)[0] == 1180  # a slower machine: below the fixed 2,000/s
    rate, basis = paced_rate(None, 2000)  # a run that did not measure one worker
    assert rate == 2000 and "did not measure" in basis


def test_the_fixed_rate_is_reported_beside_the_paced_one_only_where_it_is_below_it():
    from bench.report import fixed_round_trip_rows, round_trip_rows

    figures = {**pooled([_round([2.0] * 100)], ("host_cpu",)), "target_rate": 2000, "basis": "the fixed rate"}
    figures["raw"] = {**pooled([_round([1.0] * 100)], ("host_cpu",))}
    judged, shown = round_trip_rows(figures), fixed_round_trip_rows(figures)
    assert [row[3] for row in judged] == ["NOT met", "met"]  # p50 x2.00 > 1.5; p99 x2.00 <= 2.5
    assert [row[3] for row in shown] == ["", ""] and "target" not in shown[0][2]
    skipped = fixed_round_trip_rows({"skipped": "2,000/s is not below half the capacity (1,180/s)",
                                     "target_rate": 2000})
    assert skipped == [("send round trip at 2,000/s", "not measured",
                        "2,000/s is not below half the capacity (1,180/s)", "")]
    assert fixed_round_trip_rows(None) == []
