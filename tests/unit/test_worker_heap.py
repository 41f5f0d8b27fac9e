"""The worker's garbage-collector settings (issue 17), checked in a fresh interpreter: this one's are pytest's."""

import subprocess
import sys


def test_a_started_worker_freezes_what_start_up_loaded_and_collects_young_objects_less_often():
    probe = (
        "import gc; from treemail.consumers.app import GC_YOUNG_THRESHOLD, settle_heap; "
        "before = gc.get_threshold(); settle_heap(); "
        "print(before[0], gc.get_threshold()[0] == GC_YOUNG_THRESHOLD > before[0], gc.get_freeze_count() > 1000, "
        "gc.get_threshold()[1:] == before[1:])"
    )
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout.split()
    assert out == ["700", "True", "True", "True"]
