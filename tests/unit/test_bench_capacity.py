"""The capacity model: Valkey's cost split by where it lands, and the limit that binds first."""

from bench import capacity


def master(us: float, calls: int, held: int) -> dict:
    return {"us_per_decision": us, "script_calls": calls, "streams_held": held}


def row(worker_cpu_s: float, masters: list[dict]) -> dict:
    return {"worker_cpu_s": worker_cpu_s,
            "per_master": {"valkey_us_per_decision": sum(m["us_per_decision"] for m in masters), "masters": masters}}


def test_the_part_that_follows_the_command_streams_is_fitted_from_the_masters_that_hold_them():
    # 30 us per decision follows the sessions (calls spread evenly), 12 us the 4 streams (held 1 / 2 / 1).
    masters = [master(10 + 12 * h / 4, 100, h) for h in (1, 2, 1)]
    c = capacity.costs([row(1.0, masters)], commands=10_000, streams=4)
    assert round(c.stream_us, 6) == 12 and round(c.valkey_us, 6) == 42 and c.worker_us == 100


def test_few_command_streams_cap_the_workers_and_sized_streams_move_the_limit_to_the_masters():
    c = capacity.Costs(worker_us=100, valkey_us=40, stream_us=10, rows=1)
    default = capacity.predict(c, masters=10, partitions=16, streams=4)
    assert default.rate == 4 * 10_000 and default.workers == 4 and default.limit.startswith("workers")
    sized = capacity.sized(c, masters=10, partitions=16)
    assert sized.rate > default.rate and sized.workers > 4 and "master" in sized.limit
    # 16 partitions over 30 masters: the busiest still holds one sixteenth of the sessions.
    assert "16 of 30 masters" in capacity.predict(c, masters=30, partitions=16, streams=1024).limit


def test_the_busiest_master_is_the_one_the_slot_plan_loads_most():
    """16 partitions and 4 streams on 3 masters: 6 / 5 / 5 partitions and 1 / 1 / 2 streams, never the extra
    partition and the extra stream on one master (ceil of each would be 6 and 2)."""
    sessions_only = capacity.Costs(worker_us=1, valkey_us=48, stream_us=0, rows=1)
    assert round(capacity.predict(sessions_only, 3, 16, 4).rate) == round(1e6 / (48 * 6 / 16))
    mixed = capacity.Costs(worker_us=1, valkey_us=48 + 16, stream_us=16, rows=1)
    busiest = max(48 * 6 / 16 + 16 * 1 / 4, 48 * 5 / 16 + 16 * 2 / 4)
    assert round(capacity.predict(mixed, 3, 16, 4).rate) == round(1e6 / busiest)
    assert busiest < 48 * 6 / 16 + 16 * 2 / 4
