"""bench.report words the records' floor: whether the floor itself meets each of treemail's targets."""

from bench import report
from bench.sizes import QUICK


def test_a_floor_ratio_meets_a_target_only_on_the_targets_side():
    assert report.against_target(0.55, 0.7, at_most=False) == "the floor itself misses treemail's target (>= 0.7)"
    assert report.against_target(0.7, 0.7, at_most=False).startswith("the floor itself meets")
    assert report.against_target(2.6, 2.5, at_most=True) == "the floor itself misses treemail's target (<= 2.5)"
    assert report.against_target(2.2, 2.5, at_most=True).startswith("the floor itself meets")


def test_the_floor_rows_compare_the_floor_with_raw_and_treemail_with_the_floor():
    commands = QUICK.commands
    raw = {"rate": 20_000.0, "worker_cpu_s": 27e-6 * commands, "valkey_cpu_s": 8e-6 * commands}
    flo = {"rate": 10_000.0, "seconds": 0.5, "worker_cpu_s": 54e-6 * commands, "valkey_cpu_s": 12e-6 * commands}
    one = {"rate": 5_000.0, "worker_cpu_s": 108e-6 * commands, "valkey_cpu_s": 48e-6 * commands}
    rows = {label: (value, detail) for label, value, detail, _ in report.floor_rows(flo, raw, one, QUICK)}
    assert rows["floor / raw"] == ("0.50", "the floor itself misses treemail's target (>= 0.7)")
    assert rows["worker CPU per command, floor / raw"][0] == "2.00"
    assert rows["Valkey CPU per command, floor / raw"] == (
        "1.50", "12 us vs 8 us; the floor itself meets treemail's target (<= 2)")
    assert rows["treemail / floor"] == ("0.50", "worker CPU x2.00, Valkey CPU x4.00: the decision on top of the records")
    memory = {label: value for label, value, _, _ in report.floor_memory_rows(
        {"bytes_per_message": 600.0, "bare_xadd_bytes": 200.0}, {"bytes_per_message": 1200.0})}
    assert memory == {"records' floor: memory per message": "600 bytes", "memory treemail / floor": "2.00"}
