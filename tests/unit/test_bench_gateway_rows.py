"""bench.report words the gateway phase: the TypeScript host's p50 next to the Python host's, as a ratio."""

from bench import report


def side(send_p50: float, claim_p50: float) -> dict:
    return {"failed": 0, "send": {"p50_ms": send_p50, "p99_ms": 30.0, "calls": 600},
            "claim": {"p50_ms": claim_p50, "p99_ms": 40.0, "calls": 600}}


def test_gateway_rows_give_the_typescript_hosts_p50_as_a_ratio_of_the_python_hosts():
    g = {"sends": 300, "rounds": 2, "python": side(2.0, 1.5), "typescript": side(3.0, 3.0),
         "send_p50_ratio": 1.5, "claim_p50_ratio": 2.0}
    send, claim = report.gateway_rows(g)
    assert send == ("TypeScript host send round trip p50, via the gateway", "3.00 ms",
                    "x1.50 the Python host's 2.00 ms; p99 30.00 vs 30.00 ms; 600 calls each", "")
    assert claim[:2] == ("TypeScript host claim p50, via the gateway", "3.00 ms")
    assert claim[2].startswith("x2.00 the Python host's 1.50 ms")


def test_a_skipped_gateway_phase_says_why():
    assert report.gateway_rows({"skipped": "node and npm are not installed"}) == [
        ("TypeScript host over the gateway", "skipped", "node and npm are not installed", "")]
