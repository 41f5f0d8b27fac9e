"""bench.report words the MCP phase: sends/s and p50/p99 next to the empty tool and the host API, and the target."""

from bench import report


def figures(send_rate: float, noop_rate: float) -> dict:
    def one(rate):
        return {"rate": rate, "rates": [rate], "calls": 1000, "failed": 0, "p50_ms": 4.1, "p99_ms": 12.5}
    return {"send": one(send_rate), "noop": one(noop_rate), "host": one(900.0), "clients": 8,
            "send_over_noop": send_rate / noop_rate}


def test_mcp_rows_put_sends_next_to_the_empty_tool_and_the_host_api():
    rows = report.mcp_rows(figures(350.0, 400.0))
    assert rows[0] == ("MCP send_message, 8 clients, streamable HTTP", "350 sends/s",
                       "p50 4.10 ms, p99 12.50 ms, 1,000 calls (0 failed)", "")
    assert rows[1][:2] == ("MCP empty tool, same server, 8 clients", "400 calls/s")
    assert rows[1][2].endswith("the transport's own ceiling")
    assert rows[2][:2] == ("host API send_message, 8 callers, same run", "900 sends/s")
    assert rows[3] == ("MCP send / empty tool", "0.88", "target >= 0.7", "met")


def test_mcp_ratio_under_the_target_says_not_met():
    assert report.mcp_rows(figures(200.0, 400.0))[3] == ("MCP send / empty tool", "0.50", "target >= 0.7", "NOT met")


def test_mcp_rows_show_the_cpu_a_send_and_an_empty_call_cost_each_process_when_measured():
    m = figures(350.0, 400.0)
    assert len(report.mcp_rows(m)) == 4  # not measured (no /proc): no row
    m["send"]["cpu_ms"] = {"client": 2.1, "server": 2.0, "worker": 1.3}
    m["noop"]["cpu_ms"] = {"client": 2.05, "server": 1.5, "worker": 0.1}
    assert report.mcp_rows(m)[4] == ("CPU ms per call (client, server, worker)", "2.10 / 2.00 / 1.30",
                                     "MCP send; empty tool 2.05 / 1.50 / 0.10", "")


def test_mcp_rows_give_the_ratio_the_cpu_per_call_predicts_when_every_process_was_measured():
    m = figures(350.0, 400.0)
    m["send"]["cpu_ms"] = {"client": 1.0, "server": 1.0, "valkey": 0.5, "worker": 0.5}
    m["noop"]["cpu_ms"] = {"client": 1.0, "server": 0.5, "valkey": 0.1, "worker": 0.0}
    m["send_over_noop_by_cpu"] = 1.6 / 3.0
    assert report.mcp_rows(m)[5] == ("MCP send / empty tool, as the CPU per call predicts", "0.53",
                                     "the empty tool's CPU per call over the send's, every process summed", "")


def test_the_conversation_rows_give_each_number_of_pairs_its_rate_and_percentiles():
    rows = report.mcp_conversation_rows({
        "pairs_1": {"pairs": 1, "conversations": 54, "failed": 0, "rate": 17.63, "p50_ms": 55.5, "p99_ms": 79.6},
        "pairs_8": {"pairs": 8, "conversations": 1200, "failed": 1, "rate": 30.09, "p50_ms": 245.0, "p99_ms": 397.9},
    })
    assert rows == [
        ("MCP conversation over HTTP, 1 pair(s) (send, wait, reply, wait)", "17.6 conversations/s",
         "p50 55.5 ms, p99 79.6 ms, 54 conversations (0 failed)", ""),
        ("MCP conversation over HTTP, 8 pair(s) (send, wait, reply, wait)", "30.1 conversations/s",
         "p50 245.0 ms, p99 397.9 ms, 1,200 conversations (1 failed)", ""),
    ]


def test_the_side_by_side_rows_give_each_system_its_rate_the_ratio_and_the_other_systems_error_as_a_row():
    ours = {"pairs_1": {"pairs": 1, "conversations": 60, "failed": 0, "rate": 20.0, "p50_ms": 50.0, "p99_ms": 70.0},
            "pairs_8": {"pairs": 8, "conversations": 400, "failed": 0, "rate": 40.0, "p50_ms": 200.0, "p99_ms": 300.0}}
    theirs = {"pairs_1": {"pairs": 1, "conversations": 3, "failed": 0, "rate": 0.8, "p50_ms": 1400.0, "p99_ms": 1500.0},
              "pairs_8": {"pairs": 8, "error": "RuntimeError: send_message: archive lock timed out"}}
    rows = report.agent_mail_rows({"treemail": ours, "agent_mail": theirs})
    assert rows == [
        ("conversation side by side, 1 pair(s): treemail", "20.0 conversations/s",
         "p50 50.0 ms, p99 70.0 ms, 60 conversations (0 failed)", ""),
        ("conversation side by side, 1 pair(s): mcp-agent-mail", "0.8 conversations/s",
         "p50 1400.0 ms, p99 1500.0 ms, 3 conversations (0 failed)", ""),
        ("conversation side by side, 1 pair(s): treemail / mcp-agent-mail", "25.0", "conversations/s, same run", ""),
        ("conversation side by side, 8 pair(s): treemail", "40.0 conversations/s",
         "p50 200.0 ms, p99 300.0 ms, 400 conversations (0 failed)", ""),
        ("conversation side by side, 8 pair(s): mcp-agent-mail", "failed",
         "RuntimeError: send_message: archive lock timed out", ""),
    ]


def test_the_side_by_side_rows_of_treemail_alone_have_no_ratio():
    ours = {"pairs_1": {"pairs": 1, "conversations": 6, "failed": 0, "rate": 2.0, "p50_ms": 5.0, "p99_ms": 7.0}}
    assert [r[0] for r in report.agent_mail_rows({"treemail": ours})] == [
        "conversation side by side, 1 pair(s): treemail"]


def test_the_sends_a_server_decides_itself_have_their_rows_and_the_target_verdict():
    m = figures(200.0, 400.0)
    assert report.deciding_rows(m) == []  # a run from before they were measured
    m["send_deciding"] = {"rate": 300.0, "rates": [300.0], "calls": 900, "failed": 0, "p50_ms": 3.0, "p99_ms": 9.0}
    m["send_deciding_over_noop"] = 0.75
    rows = report.mcp_rows(m)
    assert rows[-2:] == [
        ("MCP send_message decided by its server (host_decides_sends), 8 clients", "300 sends/s",
         "p50 3.00 ms, p99 9.00 ms, 900 calls (0 failed)", ""),
        ("MCP send decided by its server / empty tool", "0.75", "target >= 0.7", "met")]
    m["send_deciding_over_noop"] = 0.6
    assert report.mcp_rows(m)[-1][3] == "NOT met"
