"""The cluster rows name the partitions each master held beside its command streams (what its share follows)."""

from bench import report


def test_cluster_rows_name_the_partitions_held_when_the_run_counted_them():
    def row(partitions):
        masters = [{"share": 1 / 3, "streams_held": s, **({"partitions_held": p} if p is not None else {})}
                   for s, p in zip((1, 1, 2), partitions)]
        return {"workers": 1, "per_master": {"masters": masters, "valkey_us_per_decision": 40.0, "crossslot": 0,
                                             "crossslot_per_decision": 0.0, "crossslot_probe": 1}}

    (share, _), = [report.cluster_rows([row((6, 5, 5))])[:2]]
    assert "command streams held 1 / 1 / 2; partitions held 6 / 5 / 5;" in share[2] and share[3] == "met"
    older = report.cluster_rows([row((None, None, None))])[0]
    assert "partitions held" not in older[2]
