"""bench.report writes BENCHMARKS.md: the run's figures whole and short, and the hand-written notes kept."""

import json

from bench import report
from bench.sizes import QUICK


def test_the_raw_figures_are_the_whole_json_one_phase_a_line():
    results = {"one": {"rate": 9303.5, "outcomes": {"ok": 100}}, "scale_single": [{"workers": 1, "rate": 1.5}]}
    text = report.raw_figures(results)
    assert json.loads(text) == results
    assert len(text.splitlines()) == len(results) + 2


def test_a_new_run_keeps_what_follows_the_notes_marker(tmp_path, monkeypatch):
    path = tmp_path / "BENCHMARKS.md"
    path.write_text("# old table\n\n" + report.NOTES_MARKER + "\n## Findings that still hold\n")
    monkeypatch.setattr(report, "ROOT", tmp_path)
    results = {
        "one": {"outcomes": {"ok": 5}}, "memory": {"body_bytes": 200},
        "sessions": {"sessions": 10, "register_seconds": 1.0, "fresh_sessions": 5,
                     "fresh_key_bytes_per_session_by_kind": {}},
        "replay": {"sessions": 20, "views_check": {}},
    }
    report.write_markdown("the table", results, {"cores": 2}, QUICK, quick=True)
    text = path.read_text()
    assert "# old table" not in text and "the table" in text
    assert text.endswith(report.NOTES_MARKER + "\n## Findings that still hold\n")
    figures = text.split("Raw figures of this run")[1].split("```\n")[1]
    assert json.loads(figures) == results


def test_cluster_rows_judge_each_masters_share_and_need_the_deliberate_cross_slot_refusal_counted():
    def row(shares, crossslot=0, probe=1):
        masters = [{"share": s, "streams_held": 1} for s in shares]
        return {"workers": 2, "per_master": {"masters": masters, "valkey_us_per_decision": 40.0,
                                             "crossslot": crossslot, "crossslot_per_decision": crossslot / 1000,
                                             "crossslot_probe": probe}}

    even, skewed = report.cluster_rows([row([0.32, 0.33, 0.35])]), report.cluster_rows([row([0.27, 0.27, 0.46])])
    assert even[0][3] == "met" and skewed[0][3] == "NOT met"
    assert even[1][3] == "met"
    assert report.cluster_rows([row([0.33] * 3, probe=0)])[1][3] == "NOT met"  # a counter that never moves proves nothing
    assert report.cluster_rows([row([0.33] * 3, crossslot=2)])[1][3] == "NOT met"
    assert report.cluster_rows([{"workers": 1}]) == []  # a run from before the masters were read
