"""The worker process's own settings: its garbage collector, checked in a fresh interpreter (this
one's is pytest's), and the command stream subscription FastStream need not copy."""

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


def test_the_subscription_is_copied_only_when_a_prefix_changes_its_name():
    from treemail.consumers.commandsubscribers import _UnprefixedStreamSub

    sub = _UnprefixedStreamSub("tm:cmd:{c0}", group="g", consumer="c", batch=True, max_records=100)

    assert sub.add_prefix("") is sub
    prefixed = sub.add_prefix("app:")
    assert prefixed is not sub and prefixed.name == "app:tm:cmd:{c0}" and sub.name == "tm:cmd:{c0}"
