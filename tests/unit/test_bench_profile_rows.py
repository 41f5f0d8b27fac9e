"""bench.report words the durability profiles side by side: durable and replicated, each over fast."""

from bench import report
from bench.sizes import QUICK


def test_the_replicated_profile_has_its_rows_next_to_the_durable_ones():
    one = {"rate": 2_000.0}
    dur = {"rate": 1_500.0, "seconds": 2.0, "outcomes": {"ok": 10}}
    rep = {"rate": 1_000.0, "seconds": 3.0, "outcomes": {"ok": 10}}
    rows = report.profile_rows(one, dur, rep, QUICK)
    labels = [label for label, *_ in rows]
    assert labels == ["treemail, 1 worker, durable profile", "durable / fast",
                      "treemail, 1 worker, replicated profile", "replicated / fast"]
    by_label = {label: (value, detail, verdict) for label, value, detail, verdict in rows}
    assert by_label["durable / fast"] == ("0.75", "target >= 0.6", "met")
    assert by_label["treemail, 1 worker, replicated profile"] == (
        "1,000 commands/s", f"{QUICK.commands:,} sends in 3.00 s, outcomes {{'ok': 10}}", "")
    value, detail, verdict = by_label["replicated / fast"]
    assert (value, verdict) == ("0.50", "")
    assert detail.startswith("WAIT for 1 replica")
