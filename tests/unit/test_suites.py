"""make test's suite runner: each suite's result read from pytest's closing line, and the totals line."""

from tests.suites import Outcome, counts_of, main, suites


def test_counts_are_read_from_pytests_closing_line_in_its_order():
    assert counts_of("3 failed, 1539 passed, 2 skipped in 340.12s (0:05:40)") == {
        "failed": 3, "passed": 1539, "skipped": 2}
    assert counts_of("==== 232 passed in 184.01s (0:03:04) ====") == {"passed": 232}
    assert counts_of("tests/unit/test_x.py ....") == {}


def test_a_suite_that_failed_without_a_summary_counts_as_one_failure():
    assert Outcome("cluster", 2, {}, 1.0).failed == 1
    assert Outcome("cluster", 1, {"failed": 2, "errors": 1, "passed": 5}, 1.0).failed == 3
    assert Outcome("cluster", 0, {"passed": 5}, 1.0).failed == 0
    assert Outcome("cluster", 1, {"failed": 1}, 61.0).line() == "make test: cluster: FAILED (exit 1): 1 failed in 61 s"


def test_one_job_runs_each_suite_in_one_process_and_two_share_both_out():
    single, cluster = suites(1)
    assert "-n" not in single.args and "-n" not in cluster.args
    shared = ("-n", "2", "--dist", "loadgroup")
    single, cluster = suites(2)
    assert single.args[-4:] == shared and cluster.args[-5:] == (*shared, "tests/integration")
    assert dict(cluster.env) == {"TREEMAIL_TEST_BACKEND": "cluster"}


def test_both_suites_run_and_are_named_when_the_first_fails(monkeypatch, capsys):
    ran = []

    def fake_run(suite):
        ran.append(suite.name)
        return Outcome(suite.name, 1 if suite.name == "single server" else 0,
                       {"failed": 2, "passed": 10} if suite.name == "single server" else {"passed": 7}, 3.0)

    monkeypatch.setattr("tests.suites.run", fake_run)
    assert main(["--jobs", "2"]) == 1
    assert ran == ["single server", "cluster"]
    *_, single, cluster, total = capsys.readouterr().out.strip().splitlines()
    assert single.startswith("make test: single server: FAILED") and cluster.startswith("make test: cluster: passed")
    assert total == "total: 17 passed, 2 failed"
