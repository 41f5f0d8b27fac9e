"""OutageLog: one line when something starts failing, one when it works again, never one per retry."""

import logging

from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import ResponseError
from redis.exceptions import TimeoutError as RedisTimeoutError

from treemail.adapters.health import Health, OutageLog


def outage_log(caplog) -> OutageLog:
    caplog.set_level(logging.WARNING, logger="test.outage")
    return OutageLog(logging.getLogger("test.outage"))


def test_a_failure_repeated_every_retry_is_one_line_and_recovery_is_one_more(caplog):
    log = outage_log(caplog)
    # given a server that is gone for a hundred retries, failing in alternating ways
    for attempt in range(100):
        log.failed("server", RedisConnectionError("refused") if attempt % 2 else RedisTimeoutError("timeout"))
    # when it answers again, twice
    log.ok("server")
    log.ok("server")
    # then two lines, neither with a traceback
    assert [r.getMessage() for r in caplog.records] == ["server failing: TimeoutError: timeout",
                                                        "server working again"]
    assert not any(r.exc_info for r in caplog.records)


def test_a_bug_keeps_its_traceback_once_and_a_lost_group_does_not(caplog):
    log = outage_log(caplog)
    try:
        raise KeyError("bug")
    except KeyError as exc:
        log.failed("reclaim pass", exc)
        log.failed("reclaim pass", exc)
    log.failed("stats", ResponseError("NOGROUP No such key 'tm:cmd:{c0}'"))
    assert [bool(r.exc_info) for r in caplog.records] == [True, False]


def test_health_is_not_alive_when_its_loop_stops_beating():
    health = Health(stale_after_s=0.0)
    health.set(True, "ready")
    assert health.alive()[0] is False and health.readiness()[0] is False
    fresh = Health(stale_after_s=30)
    fresh.set(True, "ready")
    assert fresh.alive() == (True, "alive") and fresh.readiness() == (True, "ready")
