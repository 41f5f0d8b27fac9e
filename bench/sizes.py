"""How much each phase of `make bench` does: the full run, and the smoke run (`--quick`)."""

from dataclasses import dataclass


@dataclass
class Sizes:
    trees: int
    children: int
    commands: int
    latency_rate: int
    latency_seconds: float
    latency_rounds: int  # at each rate; the percentiles are over every round's sends (bench/latency.py)
    big_events: int
    probe_sends: int
    replay_trees: int = 20  # x (1 root + replay_children) sessions
    replay_children: int = 9
    replay_events: int = 2500  # per session
    scale_trees: int = 80
    scale_children: int = 10
    scale_commands: int = 60_000
    scale_streams: int = 4
    memory_sends: int = 10_000
    million_sends: int = 1_000_000  # phase 3d: what is left after them
    sessions: int = 100_000  # phase 5b: registered on one Valkey
    mcp_seconds: float = 2.0  # phase 9: each of the empty tool, MCP sends and host sends, per round
    mcp_rounds: int = 7
    mcp_conversation_seconds: float = 10.0  # phase 9b: exchanges back to back, with each number of pairs
    wake_sends: int = 2_000  # phase 4c: one wake each (idle children)
    fanout_rounds: int = 10  # phase 4d: broadcasts to 100 descendants, a fresh tree each
    loop_rounds: int = 5  # phase 10: reports from each of 100 children, each answered
    priority_trials: int = 20  # phase 4d: urgent and normal probes each, behind 100 queued messages
    recovery_rounds: int = 3  # phase 4g: server outages, a send decided after each
    decision_commands: int = 4_000  # phase 1b: decided without I/O, best of 5 passes
    cache_sessions: int = 40  # phase 11: the page's history cache, sessions of cache_messages 16 KB messages
    cache_messages: int = 100
    cache_budget_mib: int = 32  # about half of what those sessions hold
    gateway_sends: int = 300  # phase 12: sends (each claimed) per round, from each of the Python and TypeScript hosts
    gateway_rounds: int = 5


FULL = Sizes(trees=200, children=5, commands=100_000, latency_rate=2000, latency_seconds=5.0, latency_rounds=3,
             big_events=1_000_000, probe_sends=1000)
# scale_trees: a tree for each of the 16 partitions, so even the smoke run spreads them over the cluster's masters.
QUICK = Sizes(trees=20, children=5, commands=5_000, latency_rate=500, latency_seconds=1.0, latency_rounds=1,
              big_events=20_000, probe_sends=100, replay_trees=4, replay_children=4, replay_events=2000,
              scale_trees=16, scale_children=10, scale_commands=3_000, memory_sends=1_000,
              million_sends=20_000, sessions=2_000, mcp_seconds=1.0, mcp_rounds=3, mcp_conversation_seconds=3.0, wake_sends=300,
              fanout_rounds=3, loop_rounds=2, priority_trials=3, decision_commands=1_000, recovery_rounds=1,
              cache_sessions=8, cache_messages=25, cache_budget_mib=2, gateway_sends=100, gateway_rounds=2)
