"""Phase 9b: two agents converse over streamable HTTP, receiving with leases (`treemail mcp --http --receive`).

Each pair is a root and its child, each agent an official SDK client with its own bearer token on one
server process (the app `treemail mcp --http --receive` serves), one worker process deciding the sends. A
conversation is one exchange: A sends, B's wait_for_mail takes it, B replies (which confirms what B was
shown), A's wait_for_mail takes the reply (A's next send confirms it). Each pair runs exchanges one after
another; the phase reports exchanges per second over all pairs and each exchange's p50 and p99, with 1 pair
and with 8.
"""

import asyncio
import contextlib
import subprocess
import sys
import time

from treemail.host import Treemail

from .common import Workers, bench_config, flush, percentile, worker_env
from .mcp import free_port, stop_server, wait_listening

PAIRS = (1, 8)
WARM_UP = 3
WAIT_S = 20


async def register_pairs(host: Treemail, pairs: int) -> list[tuple[str, str]]:
    """Idle pairs that may write to each other: each agent's first request opens its leased run."""
    out = []
    for p in range(pairs):
        root = await host.register_root("planner", f"pair {p}", rules={"child": "allow"}, status="idle")
        child = await host.register_child(root.session_id, "worker", f"pair {p} child", rules={"parent": "allow"},
                                          status="idle")
        out.append((root.session_id, child.session_id))
    return out


async def exchange(a, b, a_id: str, b_id: str, i: int) -> bool:
    """One conversation: A asks, B takes it and answers, A takes the answer."""
    sent = await a.call_tool("send_message", {"to": b_id, "body": f"question {i}"})
    if sent.is_error:
        return False
    asked = await b.call_tool("wait_for_mail", {"timeout_s": WAIT_S})
    if asked.is_error or not asked.structured_content["messages"]:
        return False
    replied = await b.call_tool("send_message", {"to": a_id, "body": f"answer {i}"})
    if replied.is_error:
        return False
    answered = await a.call_tool("wait_for_mail", {"timeout_s": WAIT_S})
    return not answered.is_error and bool(answered.structured_content["messages"])


async def timed(agents: list[tuple], exchange, pairs: int, seconds: float, log, label: str = "") -> dict:
    """Each pair (``agents``: the arguments ``exchange`` takes before the exchange's number) holds
    conversations back to back for ``seconds``, all pairs at once: conversations per second over all pairs,
    and each conversation's p50 and p99. The timing both sides of the side by side share (bench/agent_mail.py)."""
    latencies: list[float] = []
    failed = 0
    deadline = time.perf_counter() + seconds

    async def loop(*agent) -> None:
        nonlocal failed
        i = 0
        while time.perf_counter() < deadline:
            start = time.perf_counter()
            ok = await exchange(*agent, i)
            latencies.append(time.perf_counter() - start)
            failed += not ok
            i += 1

    started = time.perf_counter()
    await asyncio.gather(*(loop(*agent) for agent in agents))
    elapsed = time.perf_counter() - started
    out = {"pairs": pairs, "conversations": len(latencies), "failed": failed, "rate": len(latencies) / elapsed,
           "p50_ms": percentile(latencies, 50) * 1000, "p99_ms": percentile(latencies, 99) * 1000}
    log(f"  {label}{pairs} pair(s): {out['conversations']:,} conversations = {out['rate']:,.1f}/s, p50 "
        f"{out['p50_ms']:.1f} ms, p99 {out['p99_ms']:.1f} ms, {failed} failed")
    return out


async def sdk_client(stack: contextlib.AsyncExitStack, endpoint: str, headers: dict[str, str] | None = None):
    """The official SDK's client over streamable HTTP, open until ``stack`` closes: what every agent of both
    sides speaks through."""
    from mcp import Client
    from mcp.client.streamable_http import streamable_http_client
    from mcp.shared._httpx_utils import create_mcp_http_client

    http = await stack.enter_async_context(create_mcp_http_client(headers=headers))
    return await stack.enter_async_context(Client(streamable_http_client(endpoint, http_client=http), cache=None))


async def converse(endpoint: str, host: Treemail, pairs: int, seconds: float, log, label: str = "") -> dict:
    sessions = await register_pairs(host, pairs)
    async with contextlib.AsyncExitStack() as stack:
        async def client(session_id: str):
            token = await host.tools.mint_token(session_id)
            return await sdk_client(stack, endpoint, {"Authorization": f"Bearer {token}"})

        agents = [(await client(a), await client(b), a, b) for a, b in sessions]
        for a, b, a_id, b_id in agents:  # warm up; it also opens each agent's leased run
            await b.call_tool("check_mail", {})
            for i in range(WARM_UP):
                await exchange(a, b, a_id, b_id, -i)
        return await timed(agents, exchange, pairs, seconds, log, label)


@contextlib.asynccontextmanager
async def serve_treemail(url: str):
    """`treemail mcp --http --receive`'s app in a process of its own, one worker deciding the sends: yields the
    endpoint and a host to register the pairs with."""
    await flush(url)
    workers = Workers(url)
    workers.start(1)
    host = await Treemail.connect(bench_config(url), url)
    port = free_port()
    server = subprocess.Popen([sys.executable, "-m", "bench.mcp", "serve", url, str(port), "receive"],
                              env=worker_env(url), start_new_session=True)
    try:
        await wait_listening(port, server)
        yield f"http://127.0.0.1:{port}/mcp", host
        workers.check_alive()
    finally:
        stop_server(server)
        await host.close()
        workers.stop()


async def phase_mcp_conversation(url: str, seconds: float, log, pairs: tuple[int, ...] = PAIRS) -> dict:
    async with serve_treemail(url) as (endpoint, host):
        return {f"pairs_{n}": await converse(endpoint, host, n, seconds, log) for n in pairs}
