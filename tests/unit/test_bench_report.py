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
