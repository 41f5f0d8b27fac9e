"""`treemail demo` (what `make run` starts) and `treemail cluster`: a whole stack on this machine.

The demo starts an embedded Valkey unless REDIS_URL names a server, worker
processes and a projection worker, plays the scripted tree
(``demo_script``), and ends with what to try next against the stack it
leaves running: the REDIS_URL and commands to paste. The processes it starts
write their logs to files (named at the end), so the transcript holds only
the story. Ctrl-C stops everything it started.

The demo and `treemail cluster` share one ``stack``: the processes, their
orderly stop, then the server's cleanup; the scenarios live in demo_script.
"""

import asyncio
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path

from treemail.adapters import members
from treemail.adapters.config import Config
from treemail.adapters.connection import connect
from treemail.adapters.embedded import LocalValkey, LocalValkeyCluster, free_port
from treemail.host import Treemail

from .demo_script import Story, play, say
from .timeline_commands import DEFAULT_UI_PORT
from .scenarios import ScenarioFailed

DEMO_MAX_HOPS = "4"


class Pool:
    """The processes the demo started, each logging to its own file. Each runs in its own session, so a
    terminal's Ctrl-C reaches only the demo, which stops them all at once (``stop``)."""

    def __init__(self, env: dict[str, str], log_dir: Path) -> None:
        self.env, self.log_dir = env, log_dir
        self.processes: list[subprocess.Popen] = []
        self.metrics: dict[str, int] = {}

    def spawn(self, command: str, name: str) -> None:
        self.metrics[name] = port = free_port()
        with open(self.log_dir / f"{name}.log", "ab") as log:
            self.processes.append(subprocess.Popen(
                [sys.executable, "-m", "treemail", command, "--metrics-port", str(port)], env=self.env,
                stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True,
            ))

    def stop(self, grace_s: float = 20.0) -> None:
        """SIGTERM to all at once, then one shared grace period; SIGKILL for what is left after it."""
        for process in self.processes:
            process.terminate()
        deadline = time.monotonic() + grace_s
        for process in self.processes:
            try:
                process.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


@contextmanager
def stack(env: dict[str, str], log_prefix: str, workers: int, server=None) -> Iterator[Pool]:
    """``workers`` workers and a projection worker, stopped on the way out, then ``server`` cleaned up: the
    demo's and `treemail cluster`'s one way of starting and stopping what they run."""
    with ExitStack() as resources:
        if server is not None:
            resources.callback(server.cleanup)
        pool = Pool(env, Path(tempfile.mkdtemp(prefix=log_prefix)))
        resources.callback(pool.stop)
        for index in range(workers):
            pool.spawn("worker", f"worker-{index + 1}")
        pool.spawn("projections", "projections")
        yield pool


def _hop_guard_env(config: Config) -> tuple[dict[str, str], str | None]:
    """The workers' hop limit, and why scenario 5 cannot be shown with them (None when it can)."""
    if "TREEMAIL_MESSAGING_MAX_HOPS" in os.environ or config.messaging.max_hops > 0:
        if config.messaging.max_hops <= 0:
            return {}, ("off:the hop guard is off (max_hops = 0 in this configuration); "
                        f"TREEMAIL_MESSAGING_MAX_HOPS={DEMO_MAX_HOPS} turns it on")
        return {}, None
    # The storm needs a limit; an explicit setting wins.
    return {"TREEMAIL_MESSAGING_MAX_HOPS": DEMO_MAX_HOPS}, None


async def _other_workers(server, config: Config, ours: list[subprocess.Popen]) -> int:
    """Live workers on the server the demo did not start: they decide sends with their own settings."""
    pids = {str(p.pid) for p in ours}
    workers = await members.live(server, config.service.worker_timeout_ms)
    return sum(1 for consumer, _ in workers if consumer.rsplit("-", 1)[-1] not in pids)


def _treemail_command() -> str:
    """How the reader runs treemail from where they are: `treemail` may not be on PATH (make run)."""
    script = Path(sys.executable).parent / "treemail"
    if not script.exists():
        return "python -m treemail"
    try:
        return str(script.relative_to(Path.cwd()))
    except ValueError:
        return str(script)


def _next_steps(url: str, story: Story, pool: Pool, cluster: bool, once: bool) -> None:
    tm = _treemail_command()
    say("\nWhat to try next" + (" (`treemail demo` without --once keeps the stack up):" if once else
                                ", in another terminal (the stack stays up until Ctrl-C):"))
    say(f"  export REDIS_URL={url}" + ("  TREEMAIL_SERVICE_CLUSTER=true" if cluster else ""))
    rows = [
        (f"{tm} trees", "one row per tree, from the projection worker"),
        (f"{tm} history {story.handles['explore']}", "every event of a session, by handle or id"),
        (f"{tm} tail {story.handles['root']} --from-start", "its mail so far, then live (Ctrl-C ends it)"),
        (f"{tm} timeline {story.handles['explore']}", "its mailbox through time: what each step of each run saw"),
        (f"{tm} ui", f"the same in a browser, live: http://127.0.0.1:{DEFAULT_UI_PORT}/"),
        (f"{tm} approvals list", "the writer's send, waiting for a person"),
        (f"{tm} approvals approve {story.approval_id}", "let it through (--tree: for the whole tree)"),
    ]
    width = max(len(command) for command, _ in rows)
    for command, why in rows:
        say(f"  {command:<{width}}  # {why}")
    ports = ", ".join(f"{name} http://127.0.0.1:{port}/readyz" for name, port in pool.metrics.items())
    say(f"  health and /metrics: {ports}")
    say(f"  logs of the processes the demo started: {pool.log_dir}")


def _stop_on_signals() -> asyncio.Event:
    """Installed before anything is printed: a Ctrl-C right after "stack is up" must not be lost."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    return stop


async def _until(stop: asyncio.Event, work) -> bool:
    """Run ``work`` unless ``stop`` comes first; True when it finished."""
    task = asyncio.ensure_future(work)
    stopped = asyncio.ensure_future(stop.wait())
    await asyncio.wait({task, stopped}, return_when=asyncio.FIRST_COMPLETED)
    stopped.cancel()
    if task.done():
        task.result()
        return True
    task.cancel()
    await asyncio.wait({task}, timeout=5)
    return False


async def _main(config: Config, url: str, pool: Pool, hop_guard: str | None, once: bool) -> None:
    stop = _stop_on_signals()
    host = await Treemail.connect(config, url)
    # The server read below the host API (members, views), on a connection of its own.
    server = await connect(url, config.service)
    story = Story()
    try:
        if hop_guard is None and (others := await _other_workers(server, config, pool.processes)):
            hop_guard = (f"{others} other worker(s) on this server decide sends too, with their own max_hops; "
                         "give them TREEMAIL_MESSAGING_MAX_HOPS to stop storms there")
        if not await _until(stop, play(host, hop_guard, story, server, config.service.partitions)):
            return
        _next_steps(url, story, pool, config.service.cluster, once)
        if once:
            return
        say("\nstack is up; Ctrl-C stops it")
        await stop.wait()
    finally:
        # The send still waiting for a person stays a request on the server. Not cancelled: a
        # cancelled blocking read can come back from redis-py as a TimeoutError, which the
        # approval wait retries until its client closes; closing answers it engine_shutdown.
        story.closing = True
        await host.close()
        await server.aclose()
        if story.waiting_send is not None:
            await asyncio.wait({story.waiting_send}, timeout=5)
            story.waiting_send.cancel()


def run_demo(config: Config, workers: int = 2, once: bool = False, config_path: Path | None = None) -> int:
    server = None
    url = config.service.redis_url
    if not url:
        server = LocalValkey(durable=config.service.profile == "durable").start()
        url = server.url
        say(f"started embedded Valkey at {url}; its data is deleted when the demo stops (nothing is kept "
            "across a restart: `treemail server --dir DIR` keeps it)")
    else:
        say(f"using the server at {re.sub(r'//[^@/]*@', '//***@', url)}")
    extra, hop_guard = _hop_guard_env(config)
    env = {**os.environ, **extra, "REDIS_URL": url}
    if config_path is not None:
        env["TREEMAIL_CONFIG"] = str(Path(config_path).resolve())
    config = config.model_copy(update={"service": config.service.model_copy(update={"redis_url": url})})
    try:
        with stack(env, "treemail-demo-", workers, server) as pool:
            say(f"started {workers} worker processes and a projection worker")
            if extra:
                say(f"the demo's workers run with max_hops = {DEMO_MAX_HOPS} (the default, and `treemail config "
                    "show`, say 0: off) so scenario 5 can show the hop guard stop a storm; "
                    "TREEMAIL_MESSAGING_MAX_HOPS overrides it")
            try:
                asyncio.run(_main(config, url, pool, hop_guard, once))
            except ScenarioFailed as failure:
                print(f"treemail demo: {failure} (logs: {pool.log_dir})", file=sys.stderr)
                return 1
        return 0
    except KeyboardInterrupt:
        return 0
    finally:
        say("stopped")


def run_cluster(masters: int = 3, workers: int = 3, replicas: int = 0) -> None:
    """`treemail cluster` (`make cluster`): a local Valkey Cluster with workers and a projection worker.
    With ``replicas``, each primary has that many replicas and the workers wait for one of them
    (the replicated profile) unless the environment names another profile."""
    from treemail.adapters import slotplan
    from treemail.adapters.config import load_config

    # Placed as `treemail cluster-plan` would place it: each master an even share of the partitions and the
    # command streams the workers are configured with, not whatever an even split of slot ranges gives.
    service = load_config().service
    plan = slotplan.plan(masters, service.partitions, service.command_streams)
    cluster = LocalValkeyCluster(masters=masters, replicas=replicas, plan=plan).start()
    primaries = ", ".join(f"127.0.0.1:{n.port}" for n in cluster.nodes[:masters])
    say(f"started a {masters}-master Valkey Cluster: {primaries}")
    say("  slots as `treemail cluster-plan` places them: partitions "
        + " / ".join(str(len(m.partitions)) for m in plan.masters) + ", command streams "
        + " / ".join(str(len(m.streams)) for m in plan.masters))
    env = {**os.environ, "REDIS_URL": cluster.url, "TREEMAIL_SERVICE_CLUSTER": "true"}
    if replicas:
        say(f"  with {replicas} replica(s) each: " + ", ".join(f"127.0.0.1:{n.port}" for n in cluster.nodes[masters:]))
        env.setdefault("TREEMAIL_SERVICE_PROFILE", "replicated")
        say(f"  workers run profile = {env['TREEMAIL_SERVICE_PROFILE']}")
    try:
        with stack(env, "treemail-cluster-", workers, cluster) as pool:
            say(f"started {workers} workers and 1 projection worker (logs: {pool.log_dir}); use it with:")
            say(f"  export REDIS_URL={cluster.url} TREEMAIL_SERVICE_CLUSTER=true")
            say("Ctrl-C stops everything")

            async def wait() -> None:
                await _stop_on_signals().wait()

            asyncio.run(wait())
    except KeyboardInterrupt:
        pass
    finally:
        say("stopped")
