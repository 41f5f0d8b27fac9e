"""Phase 9: the MCP path. Sends over streamable HTTP from 8 clients, next to an empty tool on the same server
(the transport's own ceiling) and the host API, in the same run.

The MCP server is a process of its own (`python -m bench.mcp serve URL PORT`: the same app `treemail mcp
--http` serves, plus the empty tool `noop`), one worker process decides the sends, and the 8 clients (the
official SDK's, each with its own bearer token, each sending from its own root to its child) run in the
benchmark process, one call at a time each. The three alternate, round by round, so each round's three
see the same moments of a shared machine: each rate is the median round's, the ratio the median of the
rounds' own send / empty-tool ratios, the percentiles over every round's calls.
"""

import asyncio
import contextlib
import os
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

from treemail.host import SendContext, Treemail

from .common import Workers, bench_config, flush, percentile, register_trees, worker_env

CLIENTS = 8
WARM_UP_CALLS = 20


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def stop_server(server: subprocess.Popen) -> None:
    """The benchmark's MCP server process: asked to stop, then killed if it has not within 10 s."""
    server.terminate()
    with contextlib.suppress(subprocess.TimeoutExpired):
        server.wait(timeout=10)
    if server.poll() is None:
        server.kill()


async def wait_listening(port: int, proc: subprocess.Popen, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"the MCP server exited with {proc.returncode}")
        with contextlib.suppress(OSError):
            _, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.close()
            return
        await asyncio.sleep(0.1)
    raise RuntimeError("the MCP server did not start listening")


def cpu_seconds(pid: int) -> float | None:
    """User and system CPU seconds a process has used so far (Linux's /proc); None where it cannot be read."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def drive(callers: list, call, seconds: float, pids: dict[str, int] | None = None) -> dict:
    """Every caller calls in a loop, one call at a time, for ``seconds``: the rate, each call's latency, and the
    CPU seconds each process of ``pids`` used meanwhile (where a send's cost goes past the empty tool's: on a
    shared machine the rates follow the CPU a call costs the client, the server and the worker together)."""
    before = {name: cpu_seconds(pid) for name, pid in (pids or {}).items()}
    latencies: list[float] = []
    failed = 0
    deadline = time.perf_counter() + seconds

    async def loop(k: int, caller) -> None:
        nonlocal failed
        i = 0
        while time.perf_counter() < deadline:
            start = time.perf_counter()
            ok = await call(k, caller, i)
            latencies.append(time.perf_counter() - start)
            failed += not ok
            i += 1

    started = time.perf_counter()
    await asyncio.gather(*(loop(k, c) for k, c in enumerate(callers)))
    elapsed = time.perf_counter() - started
    cpu = {name: used - before[name] for name, pid in (pids or {}).items()
           if before[name] is not None and (used := cpu_seconds(pid)) is not None}
    return {"calls": len(latencies), "failed": failed, "rate": len(latencies) / elapsed, "latencies": latencies,
            "cpu": cpu}


async def settle(host: Treemail, pairs: list[tuple[str, str]]) -> int:
    """The children take and consume what they were sent, between rounds (untimed): a sender's unsettled
    intents are bounded (``max_outstanding_per_source``), and a full capacity would refuse the next round."""
    async def one(child: str) -> int:
        taken = await host.claim(child, "run-1")
        for delivery in taken:
            await host.consume(child, delivery.message_id)
        return len(taken)
    return sum(await asyncio.gather(*(one(child) for _, child in pairs)))


def summary(runs: list[dict]) -> dict:
    every = [x for run in runs for x in run["latencies"]]
    calls = sum(run["calls"] for run in runs)
    processes = set.intersection(*(set(run.get("cpu", {})) for run in runs)) if runs else set()
    return {"rate": statistics.median(run["rate"] for run in runs), "rates": [run["rate"] for run in runs],
            "calls": calls, "failed": sum(run["failed"] for run in runs),
            "p50_ms": percentile(every, 50) * 1000, "p99_ms": percentile(every, 99) * 1000,
            # CPU milliseconds per call, by process (the benchmark's own is the clients, or the host API's caller)
            "cpu_ms": {name: sum(run["cpu"][name] for run in runs) * 1000 / max(calls, 1) for name in sorted(processes)}}


async def phase_mcp(url: str, seconds: float, rounds: int, log, valkey_pid: int | None = None) -> dict:
    """``valkey_pid``: the server's, so each call's CPU is counted in every process it costs (on a machine
    whose cores all four share, the rates follow the sum)."""
    from mcp import Client
    from mcp.client.streamable_http import streamable_http_client
    from mcp.shared._httpx_utils import create_mcp_http_client

    await flush(url)
    workers = Workers(url)
    workers.start(1)
    host = await Treemail.connect(bench_config(url), url)
    port, port_deciding = free_port(), free_port()
    server = subprocess.Popen([sys.executable, "-m", "bench.mcp", "serve", url, str(port)], env=worker_env(url),
                              start_new_session=True)
    # The same app with [service] host_decides_sends: the server decides each send itself, no worker on its path.
    deciding = subprocess.Popen([sys.executable, "-m", "bench.mcp", "serve", url, str(port_deciding)],
                                env=worker_env(url, {"TREEMAIL_SERVICE_HOST_DECIDES_SENDS": "true"}),
                                start_new_session=True)
    try:
        trees = await register_trees(host, CLIENTS, 1)
        pairs = [(root, kids[0]) for root, kids in trees]
        tokens = [await host.tools.mint_token(root) for root, _ in pairs]
        for _, child in pairs:
            await host.start_run(child, "run-1")
        await wait_listening(port, server)
        await wait_listening(port_deciding, deciding)
        async with contextlib.AsyncExitStack() as stack:
            async def clients_of(endpoint: str) -> list:
                out = []
                for token in tokens:
                    http = await stack.enter_async_context(
                        create_mcp_http_client(headers={"Authorization": f"Bearer {token}"}))
                    out.append(await stack.enter_async_context(
                        Client(streamable_http_client(endpoint, http_client=http), cache=None)))
                return out

            clients = await clients_of(f"http://127.0.0.1:{port}/mcp")
            clients_deciding = await clients_of(f"http://127.0.0.1:{port_deciding}/mcp")

            async def noop(k, client, i) -> bool:
                return not (await client.call_tool("noop", {})).is_error

            async def mcp_send(k, client, i) -> bool:
                result = await client.call_tool("send_message", {"to": pairs[k][1], "body": f"mcp send {i}"})
                return not result.is_error

            async def host_send(k, _caller, i) -> bool:
                result = await host.send_message(SendContext(pairs[k][0], "run-1", f"host-{k}-{i}-{time.time_ns()}"),
                                                 {"to": pairs[k][1], "body": f"host send {i}"})
                return "message_id" in result

            for k, (client, other) in enumerate(zip(clients, clients_deciding)):  # warm up: connections, caches
                for i in range(WARM_UP_CALLS):
                    await noop(k, client, i)
                    await mcp_send(k, client, i)
                    await mcp_send(k, other, -i - 1)
            await settle(host, pairs)
            runs: dict[str, list[dict]] = {"noop": [], "send": [], "send_deciding": [], "host": []}
            # Each call's CPU in every process it may cost: the deciding server's is its own (nothing else
            # calls it), so the empty tool's and the other sends' count it at zero.
            pids = {"client": os.getpid(), "server": server.pid, "deciding server": deciding.pid,
                    **{f"worker{'' if i == 0 else i + 1}": proc.pid for i, proc in enumerate(workers.procs)},
                    **({"valkey": valkey_pid} if valkey_pid else {})}
            for round_ in range(rounds):
                for name, call, callers in (("noop", noop, clients), ("send", mcp_send, clients),
                                            ("send_deciding", mcp_send, clients_deciding),
                                            ("host", host_send, list(range(CLIENTS)))):
                    run = await drive(callers, call, seconds, pids)
                    runs[name].append(run)
                    await settle(host, pairs)
                    log(f"  round {round_ + 1} {name}: {run['calls']:,} calls = {run['rate']:,.0f}/s, "
                        f"{run['failed']} failed")
        workers.check_alive()
    finally:
        stop_server(server)
        stop_server(deciding)
        await host.close()
        workers.stop()
    out = {name: summary(value) for name, value in runs.items()}
    out["clients"] = CLIENTS
    for name in ("send", "send_deciding"):
        out[f"{name}_over_noop"] = statistics.median(
            send["rate"] / noop["rate"] for send, noop in zip(runs[name], runs["noop"]))
    # The ratio the CPU per call predicts (the empty tool's total over the send's): steadier than the rates'
    # on a shared machine, and it says which process the difference is in.
    for name in ("send", "send_deciding"):
        if out[name]["cpu_ms"] and out["noop"]["cpu_ms"]:
            out[f"{name}_over_noop_by_cpu"] = sum(out["noop"]["cpu_ms"].values()) / sum(out[name]["cpu_ms"].values())
    log(f"  MCP send {out['send']['rate']:,.0f}/s (p50 {out['send']['p50_ms']:.2f} ms, p99 "
        f"{out['send']['p99_ms']:.2f} ms), empty tool {out['noop']['rate']:,.0f}/s, host API "
        f"{out['host']['rate']:,.0f}/s; send / empty tool {out['send_over_noop']:.2f}; decided by the server "
        f"{out['send_deciding']['rate']:,.0f}/s, / empty tool {out['send_deciding_over_noop']:.2f}")
    if out["send"]["cpu_ms"]:
        log("  CPU ms per call (" + ", ".join(out["send"]["cpu_ms"]) + "): " + "; ".join(
            f"{label} " + " / ".join(f"{v:.2f}" for v in out[name]["cpu_ms"].values())
            for name, label in (("send", "MCP send"), ("send_deciding", "MCP send decided by the server"),
                                ("noop", "empty tool"), ("host", "host API send")))
            + f"; their sums predict send / empty tool {out.get('send_over_noop_by_cpu', 0):.2f}")
    return out


async def _serve(url: str, port: int, **app_options) -> None:
    """The MCP app in this process (the benchmark's server process): ``noop`` adds the empty tool beside
    send_message, ``receive`` serves the receiving tools (bench/mcp_conversation.py)."""
    import uvicorn

    from treemail.adapters.config import load_config
    from treemail.producers.mcp.server import http_app

    api = await Treemail.connect(load_config(), url)
    try:
        server = uvicorn.Server(uvicorn.Config(http_app(api, "127.0.0.1", port, **app_options), host="127.0.0.1",
                                               port=port, log_level="warning"))
        await server.serve()
    finally:
        await api.close()


if __name__ == "__main__" and sys.argv[1:2] == ["serve"]:
    options = {"receive": True} if sys.argv[4:5] == ["receive"] else {"noop": True}
    asyncio.run(_serve(sys.argv[2], int(sys.argv[3]), **options))
