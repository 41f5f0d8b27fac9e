"""Phase 11: the TypeScript host over `treemail gateway` next to the Python host, same machine, same run.

One worker process decides every send. Each round, the Python host (in this process) and the TypeScript
host (``bench/gateway_host.mjs``, the client in ``clients/typescript`` talking to a `treemail gateway`
process) each make ``sends`` sends, one at a time, from a root to its running child, and after each send the
child claims it: the send's round trip (call to accepted answer) and the claim's latency (call to the
claimed delivery) are timed; the consume after it is not. The two alternate round by round, so each sees
the same moments of a shared machine. Reported: each side's p50 and p99 and the p50 ratios (TypeScript over
Python): what the extra hop (an HTTP request to a gateway on the same machine) costs.
"""

import contextlib
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

from treemail.host import SendContext, Treemail

from .common import Workers, bench_config, flush, percentile, register_trees, worker_env
from .mcp import free_port, wait_listening

ROOT = Path(__file__).resolve().parents[1]
CLIENT = ROOT / "clients" / "typescript"
WARM_UP = 20


def client_ready(log) -> str | None:
    """None once the TypeScript client is built (built here if it is not); else why the phase cannot run."""
    if shutil.which("node") is None or shutil.which("npm") is None:
        return "node and npm are not installed"
    if not (CLIENT / "dist" / "src" / "index.js").exists():
        log("  building the TypeScript client (npm ci, tsc)")
        for command in (["npm", "ci", "--no-audit", "--no-fund", "--loglevel=error"], ["npx", "tsc", "-p", "."]):
            subprocess.run(command, cwd=CLIENT, check=True)
    return None


async def python_round(tm: Treemail, root: str, child: str, sends: int, warm: int, prefix: str) -> dict:
    send, claim, failed = [], [], 0
    for i in range(warm + sends):
        started = time.perf_counter()
        answer = await tm.send_message(SendContext(root, "run-1", f"{prefix}-{i}"), {"to": child, "body": f"send {i}"})
        sent = time.perf_counter()
        claimed = await tm.claim(child, "run-c")
        done = time.perf_counter()
        failed += "error" in answer or len(claimed) != 1
        for mail in claimed:
            await tm.consume(child, mail.message_id)
        if i >= warm:
            send.append((sent - started) * 1000)
            claim.append((done - sent) * 1000)
    return {"send_ms": send, "claim_ms": claim, "failed": failed}


def typescript_round(url: str, root: str, child: str, sends: int, warm: int, prefix: str) -> dict:
    job = {"url": url, "root": root, "child": child, "to": child, "run": "run-1", "child_run": "run-c",
           "sends": sends, "warm": warm, "prefix": prefix}
    done = subprocess.run(["node", str(ROOT / "bench" / "gateway_host.mjs"), json.dumps(job)], capture_output=True,
                          text=True, check=True, timeout=600)
    return json.loads(done.stdout)


def figures(rounds: list[dict]) -> dict:
    out = {"failed": sum(r["failed"] for r in rounds)}
    for name in ("send", "claim"):
        every = [x for r in rounds for x in r[f"{name}_ms"]]
        out[name] = {"p50_ms": percentile(every, 50), "p99_ms": percentile(every, 99), "calls": len(every)}
    return out


async def phase_gateway(url: str, sends: int, rounds: int, log) -> dict:
    why_not = client_ready(log)
    if why_not:
        log(f"  skipped: {why_not}")
        return {"skipped": why_not}
    await flush(url)
    workers = Workers(url)
    workers.start(1)
    port = free_port()
    gateway = subprocess.Popen([str(Path(sys.executable).parent / "treemail"), "gateway", "--port", str(port)],
                               env=worker_env(url), stdout=subprocess.DEVNULL, start_new_session=True)
    tm = await Treemail.connect(bench_config(url), url)
    try:
        (py_root, [py_child]), (ts_root, [ts_child]) = await register_trees(tm, 2, 1)
        for session, run in ((py_root, "run-1"), (ts_root, "run-1"), (py_child, "run-c"), (ts_child, "run-c")):
            await tm.start_run(session, run)
        await wait_listening(port, gateway)
        base = f"http://127.0.0.1:{port}"
        runs: dict[str, list[dict]] = {"python": [], "typescript": []}
        for n in range(rounds):
            # The Python host lives through every round: its first round warms its connections and the worker.
            # Each TypeScript round is a new node process (a new connection, code not yet compiled), so each
            # warms up: both sides are timed warm, over the same number of calls.
            runs["python"].append(await python_round(tm, py_root, py_child, sends, WARM_UP if n == 0 else 0,
                                                     f"py-{n}"))
            runs["typescript"].append(typescript_round(base, ts_root, ts_child, sends, WARM_UP, f"ts-{n}"))
            log(f"  round {n + 1}: send p50 python {percentile(runs['python'][-1]['send_ms'], 50):.2f} ms, "
                f"typescript {percentile(runs['typescript'][-1]['send_ms'], 50):.2f} ms")
        workers.check_alive()
    finally:
        await tm.close()
        gateway.terminate()
        with contextlib.suppress(subprocess.TimeoutExpired):
            gateway.wait(timeout=10)
        if gateway.poll() is None:
            gateway.kill()
        workers.stop()
    out = {"sends": sends, "rounds": rounds, **{name: figures(value) for name, value in runs.items()}}
    for name in ("send", "claim"):
        out[f"{name}_p50_ratio"] = out["typescript"][name]["p50_ms"] / out["python"][name]["p50_ms"]
    log(f"  send p50: python {out['python']['send']['p50_ms']:.2f} ms, typescript {out['typescript']['send']['p50_ms']:.2f} "
        f"ms (x{out['send_p50_ratio']:.2f}); claim p50: python {out['python']['claim']['p50_ms']:.2f} ms, typescript "
        f"{out['typescript']['claim']['p50_ms']:.2f} ms (x{out['claim_p50_ratio']:.2f})")
    return out
