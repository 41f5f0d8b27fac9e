"""`treemail demo` (what `make run` starts): the whole stack and a scripted delegation tree.

Starts an embedded Valkey unless REDIS_URL names a server, starts worker
processes, then plays a delegation through the real stack: a child reports
mid-run (steer), the parent queues a follow-up, siblings talk after an
introduction, a finished child is woken by mail, and the hop guard stops a
ping-pong storm. Ctrl-C stops everything it started.
"""

import asyncio
import os
import signal
import subprocess
import sys

from treemail.adapters.config import Config
from treemail.adapters.embedded import LocalValkey, LocalValkeyCluster
from treemail.producers.host import SendContext, Treemail
from treemail.projections.render import history_row


def _print(line: str) -> None:
    print(line, flush=True)


class ScriptedEngine:
    """A toy host: agents are scripted, but every send, claim, wake and ack goes through treemail."""

    def __init__(self, host: Treemail) -> None:
        self.host = host
        self.calls = 0
        self.runs: dict[str, str] = {}

    def ctx(self, session) -> SendContext:
        self.calls += 1
        return SendContext(session.session_id, self.runs.get(session.session_id, "no-run"), f"call-{self.calls}")

    async def start(self, session) -> None:
        self.runs[session.session_id] = f"run-{session.handle}-{self.calls}"
        await self.host.start_run(session.session_id, self.runs[session.session_id])

    async def finish(self, session, status: str = "idle") -> None:
        await self.host.finish_run(session.session_id, self.runs.pop(session.session_id))
        if status != "idle":
            await self.host.set_status(session.session_id, status)
        _print(f"  [{session.handle} is {status}]")

    async def send(self, sender, to: str, body: str, mode: str = "steer") -> dict:
        result = await self.host.send_message(self.ctx(sender), {"to": to, "body": body, "mode": mode})
        outcome = result["error"]["code"] if "error" in result else f"accepted, recipient {result['recipient_state']}"
        _print(f"  {sender.handle} -> {to} ({mode}): {body!r}\n      => {outcome}")
        return result

    async def boundary(self, session) -> list:
        """A safe model-request boundary: claim, show, consume."""
        deliveries = await self.host.claim(session.session_id, self.runs[session.session_id])
        for delivery in deliveries:
            _print(f"  [{session.handle} sees at its next model request]")
            _print("    " + delivery.text.replace("\n", "\n    "))
            await self.host.consume(session.session_id, delivery.message_id)
        return deliveries

    async def serve_one_wake(self, by_id: dict) -> None:
        for wake in await self.host.wakes("demo-runner", block_ms=2000):
            session = by_id[wake.session_id]
            self.runs[session.session_id] = f"run-{session.handle}-{self.calls}"
            if await self.host.wake_run(wake, self.runs[session.session_id]):
                _print(f"  [wake: {session.handle} starts a new run with its mail as input]")


async def _script(host: Treemail) -> None:
    engine = ScriptedEngine(host)
    root = await host.register_root("planner", "splits the task", rules={"child": "allow"})
    await engine.start(root)
    peers = {"parent": "allow", "sibling": "allow"}
    a = await host.register_child(root.session_id, "explore", "reads the code", rules=peers)
    b = await host.register_child(root.session_id, "review", "reviews changes", rules=peers)
    by_id = {s.session_id: s for s in (root, a, b)}
    _print(f"{root.handle} delegates {a.handle} and {b.handle}")
    await engine.start(a)
    await engine.start(b)

    _print("\n1. a child reports mid-run; the parent sees it at its next boundary (steer)")
    await engine.send(a, root.handle, "Found it: the cache is never invalidated.")
    await engine.boundary(root)

    _print("\n2. the parent queues a follow-up; it waits for the child's next turn")
    await engine.send(root, a.handle, "When you are done, write the fix up as a patch.", mode="queue")
    assert await engine.boundary(a) == []
    await engine.finish(a)
    await engine.serve_one_wake(by_id)
    await engine.boundary(a)

    _print("\n3. the parent introduces the siblings; they talk directly")
    await engine.send(root, b.handle, f"{a.handle} has a patch for you to review.")
    await engine.boundary(b)
    await engine.send(b, a.handle, "Send me the patch, please.")
    await engine.boundary(a)

    _print("\n4. a finished child is woken by mail")
    await engine.finish(a, status="finished")
    await engine.send(root, a.handle, "One more thing: add a test for the fix.")
    await engine.serve_one_wake(by_id)
    await engine.boundary(a)

    _print("\n5. two agents start a ping-pong storm; the hop guard stops it")
    sender, receiver = a, b
    for turn in range(10):
        result = await engine.send(sender, receiver.handle, f"ping {turn}, your turn")
        if "error" in result:
            break
        await engine.boundary(receiver)
        sender, receiver = receiver, sender

    _print("\n6. the recipient's durable history")
    for seq, event in await host.history(a.session_id):
        _print(f"  {history_row(seq, event)}")


def _spawn(command: list[str], count: int, env: dict) -> list[subprocess.Popen]:
    return [
        subprocess.Popen([sys.executable, "-m", "treemail", *command], env=env, start_new_session=True)
        for _ in range(count)
    ]


def _stop(pool: list[subprocess.Popen]) -> None:
    for process in pool:
        process.send_signal(signal.SIGTERM)
    for process in pool:
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()


def _wait_for_ctrl_c() -> None:
    # Blocked first, so sigwait (not the default action) receives them and the cleanup after runs.
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM})
    signal.sigwait({signal.SIGINT, signal.SIGTERM})


def run_cluster(masters: int = 3, workers: int = 3) -> None:
    """`treemail cluster` (`make cluster`): a local Valkey Cluster with workers and a projection worker."""
    cluster = LocalValkeyCluster(masters=masters).start()
    _print(f"started a {masters}-master Valkey Cluster: " + ", ".join(f"127.0.0.1:{n.port}" for n in cluster.nodes))
    env = {**os.environ, "REDIS_URL": cluster.url, "TREEMAIL_SERVICE_CLUSTER": "true", "TREEMAIL_METRICS_PORT": "0",
           "TREEMAIL_PROJECTION_METRICS_PORT": "0"}
    pool = _spawn(["worker"], workers, env) + _spawn(["projections"], 1, env)
    _print(f"started {workers} workers and 1 projection worker; use it with:")
    _print(f"  REDIS_URL={cluster.url} TREEMAIL_SERVICE_CLUSTER=true")
    _print("Ctrl-C stops everything")
    try:
        _wait_for_ctrl_c()
    except KeyboardInterrupt:
        pass
    finally:
        _stop(pool)
        cluster.cleanup()
        _print("stopped")


def run_demo(config: Config, workers: int = 2, once: bool = False) -> None:
    server = None
    url = config.service.redis_url
    if not url:
        server = LocalValkey(durable=config.service.profile == "durable").start()
        url = server.url
        _print(f"started embedded Valkey at {url}")
    # The storm in the script needs a hop limit; an explicit setting wins.
    env = {"TREEMAIL_MESSAGING_MAX_HOPS": "4", **os.environ, "REDIS_URL": url}
    pool = _spawn(["worker"], workers, env)
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
            _wait_for_ctrl_c()
    except KeyboardInterrupt:
        pass
    finally:
        _stop(pool)
        if server is not None:
            server.cleanup()
        _print("stopped")
