"""`treemail demo` (what `make run` starts): the whole stack and a scripted delegation tree.

Starts an embedded Valkey unless REDIS_URL names a server, starts worker
processes, then plays a short delegation: a planner delegates two children,
they report and talk through send_message, a guard refuses a storm. Ctrl-C
stops everything it started.
"""

import asyncio
import os
import signal
import subprocess
import sys

from .config import Config
from .embedded import LocalValkey
from .host import SendContext, Treemail


def _print(line: str) -> None:
    print(line, flush=True)


async def _script(host: Treemail) -> None:
    calls = iter(range(1_000_000))

    def ctx(session_id: str, run_id: str) -> SendContext:
        return SendContext(session_id, run_id, f"call-{next(calls)}")

    root = await host.register_root("planner", "splits the task", rules={"child": "allow"})
    a = await host.register_child(root.session_id, "explore", "reads the code", rules={"parent": "allow", "sibling": "allow"}, status="running")
    b = await host.register_child(root.session_id, "review", "reviews changes", rules={"parent": "allow", "sibling": "allow"}, status="running")
    _print(f"registered {root.handle} with children {a.handle} and {b.handle}")
    await host.start_run(a.session_id, "a-run-1")
    await host.start_run(root.session_id, "root-run-1")

    async def send(sender, run, to, body, mode="steer"):
        result = await host.send_message(ctx(sender.session_id, run), {"to": to, "body": body, "mode": mode})
        outcome = result.get("error", {}).get("code") or f"accepted ({result['recipient_state']})"
        _print(f"  {sender.handle} -> {to}: {body!r}  => {outcome}")
        return result

    _print("parent steers a running child:")
    await send(root, "root-run-1", a.handle, "Look at the storage layer first.")
    for claim in await host.claim(a.session_id, "a-run-1"):
        _print(f"  {a.handle} claims {claim.message_id} at a safe boundary and consumes it")
        await host.consume(a.session_id, claim.message_id)
    _print("child reports mid-run to its parent:")
    await send(a, "a-run-1", root.handle, "Found the bug: the cache is never invalidated.")
    _print("parent introduces siblings; one writes the other:")
    await send(a, "a-run-1", b.session_id, "Please review the cache fix when it lands.", mode="queue")
    _print("a model addresses someone who is not there:")
    result = await send(a, "a-run-1", "reviewer_00000000", "hello?")
    _print("  " + result["error"]["message"].replace("\n", "\n  "))
    _print("a ping-pong storm meets the per-pair window:")
    for i in range(6):
        await send(b, "b-run-1", a.handle, f"ping {i}")
    _print(f"history of {a.handle}:")
    for seq, event in await host.history(a.session_id):
        _print(f"  {seq:>3} {type(event).__name__}")


def _spawn_workers(count: int, env: dict) -> list[subprocess.Popen]:
    return [
        subprocess.Popen([sys.executable, "-m", "treemail.cli", "worker"], env=env, start_new_session=True)
        for _ in range(count)
    ]


def run_demo(config: Config, workers: int = 2, once: bool = False) -> None:
    server = None
    url = config.service.redis_url
    if not url:
        server = LocalValkey(durable=config.service.profile == "durable").start()
        url = server.url
        _print(f"started embedded Valkey at {url}")
    env = {**os.environ, "REDIS_URL": url}
    pool = _spawn_workers(workers, env)
    _print(f"started {workers} worker processes")
    try:
        async def main():
            host = await Treemail.connect(config.model_copy(update={"service": config.service.model_copy(update={"redis_url": url})}), url)
            try:
                await _script(host)
            finally:
                await host.close()

        asyncio.run(main())
        if not once:
            _print("stack is up; Ctrl-C stops it")
            signal.sigwait({signal.SIGINT, signal.SIGTERM})
    except KeyboardInterrupt:
        pass
    finally:
        for process in pool:
            process.send_signal(signal.SIGTERM)
        for process in pool:
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                process.kill()
        if server is not None:
            server.cleanup()
        _print("stopped")
