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
