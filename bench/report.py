"""The table of `make bench` and the BENCHMARKS.md it writes: one row per figure, each next to its target.

``bench.run`` measures (one function per phase); this module only words the results.
"""

import json
import time
from pathlib import Path

from treemail.adapters.config import ServiceConfig

from . import agent_mail, capacity
from .common import bench_config
from .sizes import Sizes

ROOT = Path(__file__).resolve().parent.parent


def verdict(ok: bool) -> str:
    return "met" if ok else "NOT met"


def rounds_of(figures: dict, key: str) -> str:
    """Each latency round's own figure: '0.91 / 0.95 / 1.02 ms' (the row's value is over all their sends)."""
    return " / ".join(f"{round_[key]:.2f}" for round_ in figures["rounds"]) + " ms"


# Targets against the records' floor (bench/floor.py), measured in the same run: what the decision may cost on
# top of the records every accepted send keeps, and how small those records must be.
FLOOR_RATE_AT_LEAST = 0.8
FLOOR_WORKER_CPU_AT_MOST = 1.4
FLOOR_VALKEY_CPU_AT_MOST = 1.3
FLOOR_MEMORY_AT_MOST = 1.3
FLOOR_OVER_BARE_XADD_AT_MOST = 2.3
# The send round trip against the raw XADD + BLMPOP round trip at the same pace, in the same run.
ROUND_TRIP_P50_AT_MOST = 1.5
ROUND_TRIP_P99_AT_MOST = 2.5


def floor_rows(flo: dict, rawr: dict, one: dict, sizes: Sizes) -> list[tuple[str, str, str, str]]:
    """The records' floor (bench/floor.py) next to the raw loop, and treemail judged against the floor."""
    rate = one["rate"] / flo["rate"]
    rows = [
        ("records' floor, 1 process, deciding nothing", f"{flo['rate']:,.0f} commands/s",
         f"{sizes.commands:,} sends in {flo['seconds']:.2f} s; the raw loop + the records kept per send + its answer", ""),
        ("floor / raw", f"{flo['rate'] / rawr['rate']:.2f}", "what the records alone cost the raw loop", ""),
        ("treemail / floor", f"{rate:.2f}", f"target >= {FLOOR_RATE_AT_LEAST:g}", verdict(rate >= FLOOR_RATE_AT_LEAST)),
    ]
    for who, key, target in (("worker", "worker_cpu_s", FLOOR_WORKER_CPU_AT_MOST),
                             ("Valkey", "valkey_cpu_s", FLOOR_VALKEY_CPU_AT_MOST)):
        mine, base = one[key] / sizes.commands * 1e6, flo[key] / sizes.commands * 1e6
        rows.append((f"{who} CPU per decision, treemail / floor", f"{mine / base:.2f}",
                     f"{mine:.0f} us vs {base:.0f} us, target <= {target:g}", verdict(mine / base <= target)))
    return rows


def decision_rows(dec: dict, flo: dict, one: dict, sizes: Sizes) -> list[tuple[str, str, str, str]]:
    """The worker's CPU per decision without I/O (bench/decision.py), next to the first row's whole and the
    floor's: the share of the gap only a cheaper decision can close."""
    whole = one["worker_cpu_s"] / sizes.commands * 1e6
    floor = flo["worker_cpu_s"] / sizes.commands * 1e6
    stages = ", ".join(f"{stage} {us:.0f}" for stage, us in dec["us_by_stage"].items())
    return [("worker CPU per decision, deciding alone (no I/O)", f"{dec['us_per_decision']:.0f} us",
             f"{stages} us; x{dec['us_per_decision'] / floor:.2f} the floor's whole worker CPU per command, "
             f"{dec['us_per_decision'] / whole:.2f} of treemail's", "")]


def floor_memory_rows(flo: dict, mem: dict) -> list[tuple[str, str, str, str]]:
    bare = flo["bytes_per_message"] / flo["bare_xadd_bytes"]
    kept = mem["bytes_per_message"] / flo["bytes_per_message"]
    return [
        ("records' floor: memory per message", f"{flo['bytes_per_message']:,.0f} bytes",
         f"by kind of key in the JSON (floor.memory.by_kind)", ""),
        ("floor / bare XADD", f"{bare:.2f}", f"target <= {FLOOR_OVER_BARE_XADD_AT_MOST:g} (a bare XADD "
         f"{flo['bare_xadd_bytes']:,.0f} bytes)", verdict(bare <= FLOOR_OVER_BARE_XADD_AT_MOST)),
        ("memory treemail / floor", f"{kept:.2f}", f"target <= {FLOOR_MEMORY_AT_MOST:g}",
         verdict(kept <= FLOOR_MEMORY_AT_MOST)),
    ]


def round_trip_rows(lat: dict, judged: bool = True) -> list[tuple[str, str, str, str]]:
    """The send round trip at one pace, each percentile over the raw round trip's in the same run; ``judged``:
    the targets are read at this pace (half of one worker's capacity in the run), else the ratios are shown."""
    raw = lat["raw"]
    said = {"p50": f"achieved {lat['achieved_rate']:,.0f} sends/s" + (f" ({lat['basis']})" if lat.get("basis") else ""),
            "p99": f"{lat['ok']:,} sends ({lat['failed']} failed)"}
    rows = []
    for q, target in (("p50", ROUND_TRIP_P50_AT_MOST), ("p99", ROUND_TRIP_P99_AT_MOST)):
        ratio = lat[f"{q}_ms"] / raw[f"{q}_ms"]
        rows.append((f"send round trip {q} at {lat['target_rate']:,}/s", f"{lat[f'{q}_ms']:.2f} ms",
                     f"x{ratio:.2f} the raw round trip's {raw[f'{q}_ms']:.2f} ms; {said[q]}; rounds "
                     f"{rounds_of(lat, f'{q}_ms')}" + (f"; target <= x{target:g}" if judged else ""),
                     verdict(ratio <= target) if judged else ""))
    return rows


def fixed_round_trip_rows(fixed: dict | None) -> list[tuple[str, str, str, str]]:
    """The round trip at the fixed rate of earlier runs, where it is below half the capacity; else why not."""
    if fixed is None:
        return []
    if "skipped" in fixed:
        return [(f"send round trip at {fixed['target_rate']:,}/s", "not measured", fixed["skipped"], "")]
    return round_trip_rows(fixed, judged=False)


def mcp_rows(m: dict) -> list[tuple[str, str, str, str]]:
    """The MCP path (bench/mcp.py): sends over streamable HTTP next to an empty tool on the same server and the
    host API, each with the same number of callers one call at a time."""
    def latency(figures: dict) -> str:
        return f"p50 {figures['p50_ms']:.2f} ms, p99 {figures['p99_ms']:.2f} ms, {figures['calls']:,} calls " \
               f"({figures['failed']} failed)"

    n = m["clients"]
    return [
        (f"MCP send_message, {n} clients, streamable HTTP", f"{m['send']['rate']:,.0f} sends/s", latency(m["send"]), ""),
        (f"MCP empty tool, same server, {n} clients", f"{m['noop']['rate']:,.0f} calls/s",
         latency(m["noop"]) + "; the transport's own ceiling", ""),
        (f"host API send_message, {n} callers, same run", f"{m['host']['rate']:,.0f} sends/s", latency(m["host"]), ""),
        ("MCP send / empty tool", f"{m['send_over_noop']:.2f}", "target >= 0.7", verdict(m["send_over_noop"] >= 0.7)),
    ] + ([(f"CPU ms per call ({', '.join(m['send']['cpu_ms'])})",
           " / ".join(f"{v:.2f}" for v in m["send"]["cpu_ms"].values()),
           "MCP send; empty tool " + " / ".join(f"{v:.2f}" for v in m["noop"]["cpu_ms"].values()), "")]
         if m["send"].get("cpu_ms") and m["noop"].get("cpu_ms") else []) + (
        [("MCP send / empty tool, as the CPU per call predicts", f"{m['send_over_noop_by_cpu']:.2f}",
          "the empty tool's CPU per call over the send's, every process summed", "")]
        if "send_over_noop_by_cpu" in m else []) + deciding_rows(m)


def deciding_rows(m: dict) -> list[tuple[str, str, str, str]]:
    """The same MCP sends to a server that decides them itself (``[service] host_decides_sends``)."""
    if "send_deciding" not in m:  # a run from before it was measured
        return []
    d = m["send_deciding"]
    return [
        (f"MCP send_message decided by its server (host_decides_sends), {m['clients']} clients",
         f"{d['rate']:,.0f} sends/s", f"p50 {d['p50_ms']:.2f} ms, p99 {d['p99_ms']:.2f} ms, {d['calls']:,} calls "
         f"({d['failed']} failed)", ""),
        ("MCP send decided by its server / empty tool", f"{m['send_deciding_over_noop']:.2f}", "target >= 0.7",
         verdict(m["send_deciding_over_noop"] >= 0.7)),
    ] + ([("MCP send decided by its server / empty tool, as the CPU per call predicts",
           f"{m['send_deciding_over_noop_by_cpu']:.2f}", "every process summed", "")]
         if "send_deciding_over_noop_by_cpu" in m else [])


def gateway_rows(g: dict) -> list[tuple[str, str, str, str]]:
    """The TypeScript host over `treemail gateway` next to the Python host (bench/gateway.py), same run."""
    if "skipped" in g:
        return [("TypeScript host over the gateway", "skipped", g["skipped"], "")]
    rows = []
    for name, label in (("send", "send round trip"), ("claim", "claim")):
        ts, py = g["typescript"][name], g["python"][name]
        rows.append((f"TypeScript host {label} p50, via the gateway", f"{ts['p50_ms']:.2f} ms",
                     f"x{g[f'{name}_p50_ratio']:.2f} the Python host's {py['p50_ms']:.2f} ms; p99 {ts['p99_ms']:.2f} "
                     f"vs {py['p99_ms']:.2f} ms; {ts['calls']:,} calls each", ""))
    return rows


def mcp_conversation_rows(c: dict) -> list[tuple[str, str, str, str]]:
    """Two agents conversing over streamable HTTP, receiving with leases (bench/mcp_conversation.py)."""
    return [(f"MCP conversation over HTTP, {row['pairs']} pair(s) (send, wait, reply, wait)",
             f"{row['rate']:,.1f} conversations/s",
             f"p50 {row['p50_ms']:.1f} ms, p99 {row['p99_ms']:.1f} ms, {row['conversations']:,} conversations "
             f"({row['failed']} failed)", "") for row in c.values()]


def agent_mail_rows(c: dict) -> list[tuple[str, str, str, str]]:
    """The conversation side by side (bench/agent_mail.py): each system's row for each number of pairs, the
    other system's error as its row's result, and treemail's rate over its where both ran."""
    rows = []
    for key, ours in c["treemail"].items():
        theirs = c.get("agent_mail", {}).get(key)
        for name, row in (("treemail", ours), ("mcp-agent-mail", theirs)):
            if row is None:
                continue
            label = f"conversation side by side, {row['pairs']} pair(s): {name}"
            if "error" in row:
                rows.append((label, "failed", row["error"], ""))
                continue
            rows.append((label, f"{row['rate']:,.1f} conversations/s",
                         f"p50 {row['p50_ms']:.1f} ms, p99 {row['p99_ms']:.1f} ms, {row['conversations']:,} "
                         f"conversations ({row['failed']} failed)", ""))
        if theirs and "error" not in theirs and theirs["rate"] > 0:
            rows.append((f"conversation side by side, {ours['pairs']} pair(s): treemail / mcp-agent-mail",
                         f"{ours['rate'] / theirs['rate']:.1f}", "conversations/s, same run", ""))
    return rows


def cluster_rows(rows: list[dict]) -> list[tuple[str, str, str, str]]:
    """Each cluster row's masters (bench/masters.py): their shares of Valkey's CPU, each within 15 % of an even
    share, and the cross-slot operations the masters refused per decision, next to the one refused on purpose."""
    out = []
    for row in rows:
        pm = row.get("per_master")
        if pm is None:  # a run from before the masters were read one by one
            continue
        n = len(pm["masters"])
        even = all(abs(m["share"] * n - 1) <= 0.15 for m in pm["masters"])
        out.append((f"{n}-master cluster, {row['workers']} worker(s): CPU share per master",
                    " / ".join(f"{m['share']:.2f}" for m in pm["masters"]),
                    f"{pm['valkey_us_per_decision']:.0f} us per decision over all; command streams held "
                    + " / ".join(str(m["streams_held"]) for m in pm["masters"])
                    + ("; partitions held " + " / ".join(str(m["partitions_held"]) for m in pm["masters"])
                       if all("partitions_held" in m for m in pm["masters"]) else "")
                    + f"; target: each within 15 % of 1/{n}", verdict(even)))
        out.append((f"{n}-master cluster, {row['workers']} worker(s): cross-slot operations per decision",
                    f"{pm['crossslot_per_decision']:g}",
                    f"CROSSSLOT refusals on every master ({pm['crossslot']}); one made on purpose moved the count by "
                    f"{pm['crossslot_probe']}; target 0", verdict(pm["crossslot"] == 0 and pm["crossslot_probe"] == 1)))
    return out


def profile_rows(one: dict, dur: dict, rep: dict, sizes: Sizes) -> list[tuple[str, str, str, str]]:
    """The durability profiles side by side: the first row's backlog under durable and replicated, each
    over fast (the first row's rate)."""
    ratio_dur, ratio_rep = dur["rate"] / one["rate"], rep["rate"] / one["rate"]
    return [
        ("treemail, 1 worker, durable profile", f"{dur['rate']:,.0f} commands/s",
         f"{sizes.commands:,} sends in {dur['seconds']:.2f} s, outcomes {dur['outcomes']}", ""),
        ("durable / fast", f"{ratio_dur:.2f}", "target >= 0.6", verdict(ratio_dur >= 0.6)),
        ("treemail, 1 worker, replicated profile", f"{rep['rate']:,.0f} commands/s",
         f"{sizes.commands:,} sends in {rep['seconds']:.2f} s, outcomes {rep['outcomes']}", ""),
        ("replicated / fast", f"{ratio_rep:.2f}",
         "WAIT for 1 replica on this machine; a network between them adds its round trip per batch", ""),
    ]


# The page's history cache may hold a little over its budget: its estimate per event is not exact.
CACHE_HELD_OVER_BUDGET_AT_MOST = 1.25


def history_cache_rows(cache: dict) -> list[tuple[str, str, str, str]]:
    """The web page's history cache (bench/historycache.py): what it holds against its byte budget."""
    mib = 2**20
    over = cache["held_bytes"] / cache["budget_bytes"]
    return [(f"page history cache, {cache['body_bytes'] // 1024} KB bodies, {cache['budget_bytes'] / mib:.0f} MiB "
             "budget: held", f"{cache['held_bytes'] / mib:.1f} MiB",
             f"kept {cache['kept_sessions']} of {cache['sessions']} sessions of {cache['events_per_session']} "
             f"events; estimate / held {cache['estimate_over_held']:.2f}; read whole p50 "
             f"{cache['read_whole_p50_ms']:.1f} ms, again {cache['read_again_p50_ms']:.2f} ms; the former bound "
             f"(500,000 events) {cache['former_bound_bytes'] / 2**30:.1f} GiB; target held <= "
             f"{CACHE_HELD_OVER_BUDGET_AT_MOST:g}x budget", verdict(over <= CACHE_HELD_OVER_BUDGET_AT_MOST))]


def report(results: dict, env: dict, sizes: Sizes, quick: bool, wall: float) -> str:
    one, two, rawr = results["one"], results["two"], results["raw"]
    lat, hist, low = results["latency"], results["history"], results["latency_low"]
    ratio_raw = one["rate"] / rawr["rate"]
    ratio_two = two["rate"] / one["rate"]
    rows = [
        ("treemail, 1 worker process", f"{one['rate']:,.0f} commands/s", f"{sizes.commands:,} sends in {one['seconds']:.2f} s", ""),
        ("raw Redis baseline, 1 process", f"{rawr['rate']:,.0f} commands/s", f"{sizes.commands:,} sends in {rawr['seconds']:.2f} s", ""),
        ("treemail / raw", f"{ratio_raw:.2f}", "the raw loop decides and keeps nothing; judged against the floor below",
         ""),
    ]
    rows += floor_rows(results["floor"], rawr, one, sizes)
    if "decision" in results:
        rows += decision_rows(results["decision"], results["floor"], one, sizes)
    mem = results["memory"]
    rows += profile_rows(one, results["durable"], results["replicated"], sizes)
    rows += [
        (f"memory per accepted {mem['body_bytes']}-byte message", f"{mem['bytes_per_message']:,.0f} bytes",
         f"{mem['accepted']:,} sends, used_memory delta", ""),
        ("bare XADD of the same body", f"{mem['bare_xadd_bytes']:,.0f} bytes", "", ""),
        ("memory treemail / bare", f"{mem['ratio']:.2f}", "", ""),
        *floor_memory_rows(results["floor"]["memory"], mem),
        ("command stream length after the run", f"{mem['command_stream_len_after_run']:,} entries",
         f"{mem['command_stream_len_after_trim']:,} after the worker's trim pass; reply lists left: "
         f"{mem['reply_lists_left']}", ""),
    ]
    mil = results["million"]
    rows += [
        (f"after {mil['sends']:,} sends: command stream", f"{mil['command_stream_after']:,} entries",
         f"at most {mil['command_stream_peak']:,} while fed; reply lists {mil['reply_lists_left']}, wake entries "
         f"{mil['wake_entries_after']}", ""),
        (f"after {mil['sends']:,} sends: memory per send", f"{mil['bytes_per_send']:,.0f} bytes",
         f"by kind of key in the JSON (million.by_kind); {mil['answers'].get('ok', 0):,} accepted", ""),
    ]
    rows += [
        ("treemail, 2 worker processes", f"{two['rate']:,.0f} commands/s",
         f"{sizes.commands:,} sends in {two['seconds']:.2f} s, over 2 cmd streams {two.get('per_stream', '')}", ""),
        ("2 workers / 1 worker", f"{ratio_two:.2f}", "target >= 1.3", verdict(ratio_two >= 1.3)),
        *round_trip_rows(lat),
        *fixed_round_trip_rows(results.get("latency_fixed")),
        (f"send round trip at {low['target_rate']:,}/s", f"p50 {low['p50_ms']:.2f} ms", f"p99 {low['p99_ms']:.2f} ms, {low['ok']:,} sends ({low['failed']} failed)", ""),
    ]
    fixed = results.get("latency_fixed")
    for pace in (lat, *([fixed] if fixed and "skipped" not in fixed else []), low):
        rt = pace["raw"]
        rows += [
            (f"raw XADD + BLMPOP round trip at {pace['target_rate']:,}/s", f"p50 {rt['p50_ms']:.2f} ms",
             f"p99 {rt['p99_ms']:.2f} ms, {rt['ok']:,} sends ({rt['failed']} failed), same process, pace, concurrency",
             ""),
            (f"host CPU per send at {pace['target_rate']:,}/s, treemail / raw", f"{pace['host_cpu_ratio']:.2f}",
             f"{pace['host_cpu_us_per_send']:.0f} us vs {rt['host_cpu_us_per_send']:.0f} us; answers per pop "
             f"{pace['answers_per_listener_wakeup']:.1f} vs {rt['answers_per_listener_wakeup']:.1f}", ""),
        ]
    cache = results.get("history_cache")
    if cache is not None:
        rows += history_cache_rows(cache)
    loops = results.get("fanout_loops")
    if loops is not None:
        rows.append((f"loop detection: false refusals, {loops['children']} children x {loops['rounds']} rounds",
                     f"{loops['false_refusals']}", f"{loops['sends']:,} sends (p50 {loops['p50_ms']:.2f} ms with claim and "
                     f"consume); a ping-pong stopped after {loops['loop_stopped_after_messages']} messages, "
                     f"{loops['ancestor_notices']} notice", verdict(loops["false_refusals"] == 0)))
    wake = results.get("wake_latency")
    if wake is not None:
        rows.append(("wake latency p99, commit to trigger", f"{wake['p99_ms']:.2f} ms",
                     f"p50 {wake['p50_ms']:.2f} ms over {wake['wakes']:,} wakes at {wake['rate']}/s (a host runner's "
                     "blocking read)", ""))
    back = results.get("recovery")
    if back is not None:
        rows.append((f"first decision after a {back['outage_s']} s server outage / healthy round trip",
                     f"{back['ratio']:.0f}", f"{back['after_p50_s']:.2f} s (max {back['after_max_s']:.2f} s over "
                     f"{back['rounds']} outages) against {back['healthy_p50_ms']:.2f} ms; the send is made 0.5 s after "
                     "the server is back", ""))
    fan = results.get("fanout")
    if fan is not None:
        rows.append((f"broadcast fan-out p99, {fan['descendants']} descendants", f"{fan['p99_ms']:.1f} ms",
                     f"p50 {fan['p50_ms']:.1f} ms, call to each copy claimable; the whole call p50 "
                     f"{fan['call_p50_ms']:.1f} ms ({fan['rounds']} rounds, {fan['workers']} workers)", ""))
    flow = results.get("backpressure")  # flow control: retries honouring retry_after_ms
    for name, out in (flow or {}).items():
        rows.append((f"retry after retry_after_ms succeeds, {name} consumer",
                     f"{out['retries_accepted']}/{out['retries']}",
                     f"{out['retries_per_accepted']:.2f} retries per accepted message, {out['accepted']} accepted, "
                     f"{out['silent_drops']} silent drops (controllable clock)", verdict(out["silent_drops"] == 0)))
    prio = results.get("priority")
    if prio is not None:
        urgent, normal = prio["urgent"], prio["normal"]
        rows.append((f"urgent steer behind {prio['chatter']} queued, send to claim p50", f"{urgent['p50_ms']:.2f} ms",
                     f"read at position {urgent['position']} of {urgent['claimed']}; a normal one "
                     f"{normal['p50_ms']:.2f} ms, read at position {normal['position']}", ""))
    rows += [
        (f"send p50, {hist['events']:,}-event recipient", f"{hist['big_p50_ms']:.2f} ms", f"p99 {hist['big_p99_ms']:.2f} ms, {hist['events']:,} events", ""),
        ("send p50, fresh recipient", f"{hist['fresh_p50_ms']:.2f} ms", f"p99 {hist['fresh_p99_ms']:.2f} ms", ""),
        ("long / fresh stream (p50)", f"{hist['ratio_p50']:.2f}", "target <= 1.2", verdict(hist["ratio_p50"] <= 1.2)),
    ]
    pop = results["sessions"]
    rows += [
        (f"memory per registered session, {pop['sessions']:,} sessions", f"{pop['bytes_per_session']:,.0f} bytes",
         f"used_memory delta, {pop['keys_per_session']:.1f} keys per session, registered at "
         f"{pop['register_rate']:,.0f}/s", ""),
        (f"send p50, {pop['sessions']:,}-session server", f"{pop['populated_p50_ms']:.2f} ms",
         f"p99 {pop['populated_p99_ms']:.2f} ms", ""),
        (f"send p50, fresh server ({pop['fresh_sessions']} sessions)", f"{pop['fresh_p50_ms']:.2f} ms",
         f"p99 {pop['fresh_p99_ms']:.2f} ms", ""),
        ("populated / fresh server (p50)", f"{pop['ratio_p50']:.2f}", "target <= 1.2", verdict(pop["ratio_p50"] <= 1.2)),
    ]
    rep = results["replay"]
    rows += [
        ("replay: rebuild(write=False), 1 process", f"{rep['replay_rate']:,.0f} events/s",
         f"{rep['events']:,} events, {rep['sessions']} sessions, in {rep['replay_seconds']:.2f} s", ""),
        ("replay: raw XRANGE + json.loads", f"{rep['raw_rate']:,.0f} events/s",
         f"{rep['raw_events']:,} events in {rep['raw_seconds']:.2f} s", ""),
        ("replay / raw", f"{rep['ratio']:.2f}", "target >= 0.7", verdict(rep["ratio"] >= 0.7)),
        ("replay: rebuild(write=True), 1 process", f"{rep['write_rate']:,.0f} events/s",
         f"{rep['write_events']:,} events in {rep['write_seconds']:.2f} s, {rep['write_ratio']:.2f} of raw", ""),
    ]
    for key, where in (("scale_single", "one Valkey"), ("scale_cluster", "3-master cluster")):
        base = results[key][0]["rate"]
        for row in results[key]:
            rows.append((f"{where}, {row['workers']} worker(s), {sizes.scale_streams} cmd streams",
                         f"{row['rate']:,.0f} commands/s",
                         f"{sizes.scale_commands:,} sends in {row['seconds']:.2f} s, x{row['rate'] / base:.2f} vs 1 worker, "
                         f"noise {row['other_cpu_s'] / row['seconds']:.2f} cores",
                         ""))
    rows += cluster_rows(results["scale_cluster"])
    routing = results["routing"]
    for route in ("by_tree", "by_sender"):
        row = routing[route]
        rows.append((f"mail both ways, 2 workers, routed {route.replace('_', ' ')}", f"{row['rate']:,.0f} commands/s",
                     f"worker CPU {row['worker_cpu_us']:.0f} us per decision; runs "
                     + " / ".join(f"{rate:,.0f}" for rate in row["rates"]), ""))
    rows.append(("routed by tree / by sender", f"{routing['ratio']:.2f}", "same run, alternating", ""))
    if "mcp" in results:
        rows += mcp_rows(results["mcp"])
    if "gateway" in results:
        rows += gateway_rows(results["gateway"])
    if "mcp_conversation" in results:
        rows += mcp_conversation_rows(results["mcp_conversation"])
    if "agent_mail" in results:
        rows += agent_mail_rows(results["agent_mail"])
    widths = [max(len(r[i]) for r in rows) for i in range(4)]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(r, widths)).rstrip() for r in rows]
    header = (f"{'QUICK smoke run (not the reference figures); ' if quick else ''}"
              f"CPU {env['cpu']}, {env['cores']} cores, Python {env['python']}, {env['valkey']}, {env['os']}; "
              f"`make bench` took {wall:.0f} s")
    return header + "\n\n" + "\n".join(lines)


# Everything after this marker in BENCHMARKS.md is hand-written analysis; a new run keeps it.
NOTES_MARKER = "<!-- notes: kept across runs -->"


def raw_figures(results: dict) -> str:
    """The run's figures as JSON, one phase a line: the whole of them, short enough to sit under the table."""
    lines = [f" {json.dumps(key)}: {json.dumps(value, default=str)}" for key, value in results.items()]
    return "{\n" + ",\n".join(lines) + "\n}"


def capacity_section(results: dict, sizes: Sizes) -> str:
    """The model of ``bench.capacity`` on this run's cluster rows (docs/benchmarks.md explains it)."""
    rows = [row for row in results.get("scale_cluster", []) if "per_master" in row]
    if not rows:
        return "No cluster rows with per-master figures in this run."
    defaults = ServiceConfig()
    costs, predictions = capacity.model(rows, sizes.scale_commands, sizes.scale_streams, defaults.partitions,
                                        defaults.command_streams)
    return (f"Predicted decisions (sends) per second for 3, 10 and 30 masters, each first as configured by default "
            f"({defaults.partitions} partitions, {defaults.command_streams} command streams), then with partitions at least "
            f"the masters and the fewest command streams that reach the masters' limit; the workers it takes. At "
            f"saturation of one core per master and per worker; how it is computed and what it leaves out: "
            f"docs/benchmarks.md.\n\n" + capacity.markdown(costs, predictions))


def write_markdown(table: str, results: dict, env: dict, sizes: Sizes, quick: bool) -> None:
    path = ROOT / "BENCHMARKS.md"
    outcomes = results["one"]["outcomes"]
    pop, rep = results["sessions"], results["replay"]
    text = f"""# Benchmarks

Produced by `make bench` (`python -m bench.run{' --quick' if quick else ''}`) on {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}.
One run against one local Valkey started by the benchmark (`LocalValkey(durable=False)`, profile `fast`),
flushed between phases (`FLUSHALL SYNC`: a phase starts once the last one's keys are freed), except the
durable row (a Valkey of its own with AOF) and the cluster rows (a local `LocalValkeyCluster(masters=3)`).
Valkey, the worker process(es) and the benchmark process share the machine's {env['cores']} cores (the table's first line).

```
{table}
```

## What each row measures

Rates are commands decided per second of wall time. CPU per decision is a process's CPU time, read from /proc over the
timed span, divided by the commands. Latencies are a host's `send_message` call to its result. Memory is Valkey's
`used_memory` after minus before, per message. Where a row has a target, the last column says whether this run met it.

- **treemail, 1 worker; raw Redis baseline; treemail / raw; CPU per decision.** {sizes.trees} trees of 1 root + {sizes.children}
  children registered through the host API ({sizes.trees * sizes.children:,} recipients, `max_pending_per_session` 1e9,
  `max_inflight_per_pair` 0, one command stream); {sizes.commands:,} `SendMessage` commands (the roots take turns, each to a
  random child of its tree) XADDed before the worker starts. The group cursor is held at the end until the workers have
  joined, then rewound to 0, so start-up is not timed; time runs from the group's first read until `XINFO GROUPS`
  shows pending 0 and lag 0. Outcomes: {outcomes}. The raw baseline decides the same backlog shape in the benchmark
  process, a plain `redis.asyncio` loop: `XREADGROUP COUNT 100`, pipelined `HMGET` of each recipient's state hash, one
  pipelined Lua compare-and-set per command (check `version`, `XADD`, `HSET version`), one `XACK` per batch; no
  idempotency record, no snapshot, no answer. `treemail / raw` is information: the raw loop keeps less than an
  accepted send must, so treemail is judged against the records' floor below.
- **records' floor** (`bench/floor.py`): the raw loop's shape ({sizes.trees * sizes.children:,} root -> child pairs, UUIDv7
  ids) and batching, whose one script call per command writes the records treemail keeps for an accepted send, each in
  the fewest bytes that still says what it must, and decides nothing: the sender's idempotency evidence (run and tool
  call -> message id), both sessions' versions, the message on the recipient's stream (id, sender, mode, hops, body),
  the sender's record of it (its retained status), the mail item that keeps it an obligation, one feed entry, and the
  answer on a reply list (one `EXPIRE` and one `XACK` per batch). Treemail's targets are stated against it, in the
  same run: at least 0.8 of its rate, at most 1.4x its worker CPU and 1.3x its Valkey CPU per decision, at most 1.3x
  its memory per message; and the floor itself at most 2.3x a bare `XADD`'s memory. The rate and the worker's CPU are
  this loop's own; a cleverer client does better. Memory: {sizes.memory_sends:,} sends of a 200-byte body, 20 roots to 5 children each, after one warm-up
  send per pair, the command stream and reply list freed before the second read. Streams grow by whole 2 KB nodes
  (`stream-node-max-bytes 2048`, as deployed): 100 messages per recipient fill them, the quick run's 10 do not.
- **deciding alone (no I/O)** (`bench/decision.py`): the first row's trees and backlog shape decided in the
  benchmark process on held states, 100 commands a batch, chained through the batch as a round chains them:
  parsed, resolved (the directory's cache), decided, planned and laid out as the commit script's arguments, and
  sent nowhere; the best of 5 passes over {sizes.decision_commands:,} commands, its process CPU per decision by stage.
  No worker costs less per decision than this, whatever its I/O; next to the floor's whole worker CPU it says how
  much of the gap only a cheaper decision can close.
- **durable profile**: the first row's backlog on a Valkey of its own with AOF, the worker with
  `TREEMAIL_SERVICE_PROFILE=durable` (WAITAOF before success); `durable / fast` is its rate over the first row's.
- **replicated profile**: the first row's backlog on a Valkey of its own with one replica on this machine, the worker
  with `TREEMAIL_SERVICE_PROFILE=replicated` (WAIT for `min_replicas = 1` after each batch's appends, before any
  answer); `replicated / fast` is its rate over the first row's.
- **memory per accepted message**: one worker; 20 roots of 5 children, one warm-up send per pair (a pair's first
  message also registers its producer), then {sizes.memory_sends:,} sends of a {results['memory']['body_bytes']}-byte body through
  the host, 50 in flight; next to {sizes.memory_sends:,} bare `XADD`s of the body on the same server. Every key's exact
  `MEMORY USAGE` by kind of key, per message, is in the JSON (`memory.by_kind`). The command stream row: its length
  right after those sends and after the worker's periodic trim (every `reclaim_idle_ms / 2`, given up to 20 s).
- **after {sizes.million_sends:,} sends** (`bench/million.py`): one worker; the benchmark process XADDs the commands in
  chunks of 10,000 (1 root + 1 child per tree, enough roots that none reaches the per-source capacity; nobody
  consumes), never more than 50,000 undecided, and takes the answers as a host does. The worker's periodic pass then
  gets up to 20 s; what is left is read, and every key's `MEMORY USAGE` summed by kind (`million.by_kind`).
- **2 worker processes**: the first row's backlog over two command streams (each root's on `crc32(root) % 2`, as
  producers route them; the commands on each in the row), two `treemail worker` processes, each reading the stream it
  owns (`consumers/ownership.py`); `2 workers / 1 worker` is over the first row.
- **send round trip**: one worker; a host (`Treemail.connect`) paced at half of the first row's rate (one worker's
  capacity in this run, rounded down to tens of sends/s), again at the fixed {sizes.latency_rate:,}/s of earlier runs
  where that is below it, and at {sizes.latency_rate // 4:,}/s, for {sizes.latency_seconds:g} s, every send its own task
  (many in flight), 20 roots taking turns, each to its 5 children. {sizes.latency_rounds} round(s) at each rate
  (`bench/latency.py`), each on a flushed server with its own worker: p50, p99 and CPU per send are over all the rounds'
  sends; each round's own p50 and p99 are in the row. Targets at half the capacity: p50 at most 1.5x and p99 at most
  2.5x the raw round trip's below, in the same run (at a fixed rate a slower machine's worker runs near its limit, and
  the round trip measures its queue).
- **raw XADD + BLMPOP round trip; host CPU per send**: after each round, same process, pace, concurrency, senders and
  bodies, through `bench/roundtrip.py`'s client shaped like treemail's producer (XADD a command-sized entry, await a
  future; one listener BLMPOPs up to 1000 answers a pop) and a consumer subprocess deciding nothing (`XREADGROUP COUNT
  100 BLOCK 100`, one pipelined `LPUSH` + `EXPIRE` per reply list, `XACK` per batch). Host CPU per send is the benchmark
  process's CPU over the paced span per send (pacer and listener included). No target: a consumer that falls behind
  answers many sends per pop (answers per pop, in the row), which lowers it.
- **~1M-event recipient**: one child's stream pre-filled with ProducerRegistered + (Accepted, Consumed) pairs at ids
  `<n>-0`, its state hash at version n with the real fold's snapshot; {sizes.probe_sends:,} sequential sends to it
  interleaved with {sizes.probe_sends:,} to a fresh child, one worker.
- **{pop['sessions']:,}-session server**: trees of 1 root + 9 children registered through the host API (all `idle`,
  SessionRegistered decided and committed as every registration is), 16 trees in flight from one process;
  {pop['register_seconds']:.0f} s for all. Memory per session: `used_memory` delta over the sessions in the partitions' session
  sets; by kind of key, per session, on the fresh server's {pop['fresh_sessions']} sessions before any mail:
  {pop['fresh_key_bytes_per_session_by_kind']}. The baseline is a second `LocalValkey` holding 5 trees, with its own
  worker (a fresh session on the populated server would share the keyspace whose size is measured); on each server the
  9 children of 5 trees (on the big one, spread over the population) open a run and send to their root, one warm-up
  each, then {sizes.probe_sends:,} sequential sends to each, alternating send by send so both see the same moments of the machine.
- **replay**: {rep['sessions']} sessions ({sizes.replay_trees} trees of 1 root + {sizes.replay_children} children), each stream filled server-side
  with real event JSON (ProducerRegistered + (Accepted, Consumed) pairs), about {sizes.replay_events:,} events per session.
  `projections.replay.rebuild(store, all {bench_config('').service.partitions} partitions, write=False)`, fresh `EventStore`, all four projections, in the
  benchmark process, against a raw loop over the same streams (`SMEMBERS` of each partition's session set, `XRANGE` in
  chunks of 10,000, `json.loads` of every `data`). `write=True`, as `treemail replay` runs it, also writes each
  partition's views and checkpoints in one MULTI/EXEC. The three alternate twice; the best of two each is shown.
  Views checked (the written ones must equal them): {rep['views_check']}.
- **scale-out** (one Valkey, then the 3-master cluster, its workers with `TREEMAIL_SERVICE_CLUSTER=true`):
  {sizes.scale_trees} trees of 1 root + {sizes.scale_children} children, roots chosen so each of {sizes.scale_streams} command streams gets as many
  senders; {sizes.scale_commands:,} commands (root -> random child) on `keys.command_stream(crc32(root) % {sizes.scale_streams})`; 1, 2 and 4
  workers sharing the streams out, one reader each, timed as the first row from one heartbeat after the last joined;
  each row on a flushed server. Noise is the CPU other processes used over the span. On the cluster each master is
  read on its own around the drain (`bench/masters.py`): its CPU (`INFO cpu`) as a share of all three, the command
  streams it holds, and the `CROSSSLOT` refusals in `INFO errorstats` (a command or script whose keys span slots is
  refused and counted there; one is made on purpose first, and must move the count by 1).
- **mail both ways** (routing): as scale-out on one Valkey with 2 workers, but every other round of the trees a random
  child sends to its root; the same backlog put on the streams by tree (`crc32(root)`, as producers route) and by
  sender (`crc32(sender)`: a child's report then often sits on another worker's stream than its root's mail). The two
  alternate, twice each; each row is their mean.
- **MCP** (`bench/mcp.py`): `treemail mcp --http`'s app in a process of its own (plus `noop`, a tool that does
  nothing past the transport and the bearer-token check), one worker; {sizes.mcp_rounds} round(s) of {sizes.mcp_seconds:g} s each
  of the empty tool, `send_message` (each of 8 official-SDK clients, its own token, from its root to its child) and
  the host API's `send_message` from 8 concurrent callers in the benchmark process, in turn; every caller makes one
  call at a time. Rates are the median round's; the ratio is the median of the rounds' own send / empty-tool
  ratios (the three alternate, so each round's share the machine's moments); percentiles over every round's calls.
- **page history cache** (`bench/historycache.py`): {sizes.cache_sessions} sessions, each with {sizes.cache_messages} accepted and
  consumed messages of 16 KB bodies written on its stream, read through one `HistoryCache` with a
  {sizes.cache_budget_mib} MiB budget (about half of them), each read whole once and, if kept, again with nothing appended.
  Held: what a fresh cache's kept histories hold after the same reads, by tracemalloc (a pass of its own); the
  estimate is the cache's own count (`mailboxes.event_bytes`). The former bound is held per event x 500,000.
- **the host gateway** (`bench/gateway.py`): one worker, `treemail gateway` in a process of its own; each of
  {sizes.gateway_rounds} round(s), the Python host (the benchmark process) and then the TypeScript host (`bench/gateway_host.mjs`, the
  client of `clients/typescript`, over HTTP to the gateway) make {sizes.gateway_sends} sends each, one at a time, from a root to its
  running child, which claims each at once: the send's round trip and the claim are timed, the consume is not.
  Each TypeScript round is a new node process and warms up first, as the Python host's first round does.
  The ratios are the TypeScript host's p50 over the Python host's, over every round's calls.
- **MCP conversation** (`bench/mcp_conversation.py`): `treemail mcp --http --receive`'s app in a process of its own,
  one worker; each pair a root and its child, each an official-SDK client with its own token; a conversation is
  A's send, B's `wait_for_mail`, B's reply (confirming what B was shown), A's `wait_for_mail`; pairs converse back to
  back for {sizes.mcp_conversation_seconds:g} s with 1 pair, then 8; percentiles over every conversation.
- **Side by side with mcp-agent-mail** (`bench/agent_mail.py`): the same conversation through the same client,
  treemail as above, then mcp-agent-mail 0.1.0 (its HTTP server on SQLite and a Git archive in a temporary
  directory, installed into the bench-only `.venv-agentmail` from `bench/agent_mail.constraints.txt`): A's
  `send_message`, B's `fetch_inbox` asked every {agent_mail.POLL_S * 1000:g} ms until the message is there (it has no
  blocking wait), B's `reply_message`, A's `fetch_inbox` likewise; its failure is its row's result.

## Capacity model

{capacity_section(results, sizes)}

Raw figures of this run (JSON, one phase a line):

```
{raw_figures(results)}
```
"""
    notes = ""
    if path.exists() and NOTES_MARKER in path.read_text():
        notes = path.read_text().split(NOTES_MARKER, 1)[1]
    path.write_text(text + "\n" + NOTES_MARKER + notes)
