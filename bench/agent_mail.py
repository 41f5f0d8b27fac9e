"""Phase 9c: the two-agent conversation over MCP's streamable HTTP, treemail beside mcp-agent-mail.

The same client (the official MCP SDK's), the same timing (``mcp_conversation.timed``) and the same
conversation on each side: A sends, B receives, B replies, A receives, pairs back to back, with 1 pair and
with 8, in one phase so both sides see the same machine.

- treemail: phase 9b's conversation (`treemail mcp --http --receive` in a process of its own, one worker):
  B and A receive with ``wait_for_mail``, which blocks on the session's stream;
- mcp-agent-mail (PyPI ``mcp-agent-mail``, its HTTP server ``python -m mcp_agent_mail.http`` on a SQLite
  database and a Git archive in a temporary directory): A's ``send_message``, B polls ``fetch_inbox`` (it has
  no blocking wait) every ``POLL_S`` until the message is there, B answers with ``reply_message``, A polls.

mcp-agent-mail is installed into a virtualenv of its own, ``.venv-agentmail`` (created here on first use, or
by ``make bench-agentmail``), from the pinned ``bench/agent_mail.constraints.txt``: never into the project's
locked ``.venv``. A failure of that side (its install, its server, or a conversation) is a row with its error,
not the end of the benchmark.
"""

import asyncio
import contextlib
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from .mcp import free_port, stop_server, wait_listening
from .mcp_conversation import PAIRS, WAIT_S, WARM_UP, converse, sdk_client, serve_treemail, timed

ROOT = Path(__file__).resolve().parent.parent
VENV = ROOT / ".venv-agentmail"
CONSTRAINTS = Path(__file__).with_name("agent_mail.constraints.txt")
PACKAGE = "mcp-agent-mail==0.1.0"
# How often a receiving agent asks mcp-agent-mail's inbox again while it waits (it offers no blocking wait).
POLL_S = 0.01
START_S = 120.0  # its server imports LiteLLM and more before it listens


def agent_mail_python(log) -> Path:
    """The bench-only virtualenv's interpreter, created and filled from the pinned constraints if missing."""
    python = VENV / "bin" / "python"
    if not python.exists():
        log(f"  installing {PACKAGE} into {VENV.name} (bench only, {CONSTRAINTS.name})")
        subprocess.run([sys.executable, "-m", "venv", str(VENV)], check=True)
        subprocess.run([str(python), "-m", "pip", "install", "--quiet", "-c", str(CONSTRAINTS), PACKAGE], check=True)
    return python


@contextlib.asynccontextmanager
async def serve_agent_mail(python: Path):
    """mcp-agent-mail's HTTP server on a free port, its database and archive in a temporary directory;
    yields its MCP endpoint and a project key."""
    with tempfile.TemporaryDirectory(prefix="bench-agentmail-") as home:
        port = free_port()
        env = {**os.environ, "STORAGE_ROOT": f"{home}/archive", "DATABASE_URL": f"sqlite+aiosqlite:///{home}/db.sqlite3",
               "LLM_ENABLED": "false", "LITELLM_LOCAL_MODEL_COST_MAP": "True", "HTTP_RATE_LIMIT_ENABLED": "false"}
        with open(f"{home}/server.log", "wb") as out:
            server = subprocess.Popen([str(python), "-m", "mcp_agent_mail.http", "--host", "127.0.0.1", "--port",
                                       str(port), "--log-level", "warning"], cwd=home, env=env, stdout=out,
                                      stderr=subprocess.STDOUT, start_new_session=True)
        try:
            try:
                await wait_listening(port, server, START_S)
            except RuntimeError as error:
                raise RuntimeError(f"{error}: {Path(home, 'server.log').read_text()[-500:]}") from None
            yield f"http://127.0.0.1:{port}/mcp/", f"{home}/project"
        finally:
            stop_server(server)


class Mailbox:
    """One agent of mcp-agent-mail through its MCP tools; ``seen``: the newest message id it has received."""

    def __init__(self, client, project: str, name: str) -> None:
        self.client = client
        self.project = project
        self.name = name
        self.seen = 0

    async def call(self, tool: str, **arguments):
        result = await self.client.call_tool(tool, {"project_key": self.project, **arguments})
        if result.is_error:
            raise RuntimeError(f"{tool}: {result.content[0].text if result.content else result}"[:300])
        return result.structured_content

    async def receive(self) -> dict | None:
        """Its next message: the inbox asked every ``POLL_S`` until one newer than the last seen is there,
        at most ``WAIT_S``."""
        deadline = time.perf_counter() + WAIT_S
        while time.perf_counter() < deadline:
            inbox = await self.call("fetch_inbox", agent_name=self.name, include_bodies=True, limit=5)
            new = [m for m in inbox["result"] if m["id"] > self.seen]
            if new:
                newest = max(new, key=lambda m: m["id"])
                self.seen = newest["id"]
                return newest
            await asyncio.sleep(POLL_S)
        return None


async def exchange(a: Mailbox, b: Mailbox, i: int) -> bool:
    """One conversation, as phase 9b's: A asks, B takes it and answers, A takes the answer."""
    await a.call("send_message", sender_name=a.name, to=[b.name], subject=f"question {i}", body_md=f"question {i}")
    asked = await b.receive()
    if asked is None:
        return False
    await b.call("reply_message", message_id=asked["id"], sender_name=b.name, body_md=f"answer {i}")
    return await a.receive() is not None


async def converse_agent_mail(endpoint: str, project: str, pairs: int, seconds: float, log) -> dict:
    async with contextlib.AsyncExitStack() as stack:
        agents = []
        for p in range(pairs):
            a = Mailbox(await sdk_client(stack, endpoint), project, f"Asker{pairs}x{p}")
            b = Mailbox(await sdk_client(stack, endpoint), project, f"Answerer{pairs}x{p}")
            for agent in (a, b):
                await agent.call("register_agent", program="bench", model="none", name=agent.name)
            agents.append((a, b))
        for a, b in agents:
            for i in range(WARM_UP):
                await exchange(a, b, -i)
        return await timed(agents, exchange, pairs, seconds, log, "mcp-agent-mail ")


async def agent_mail_side(seconds: float, log, pairs: tuple[int, ...]) -> dict:
    """mcp-agent-mail's rows: each number of pairs measured, or its error."""
    out: dict = {}
    try:
        python = agent_mail_python(log)
        async with serve_agent_mail(python) as (endpoint, project):
            for n in pairs:
                try:
                    out[f"pairs_{n}"] = await converse_agent_mail(endpoint, project, n, seconds, log)
                except Exception as error:  # noqa: BLE001 - the other system's failure is a result to report
                    out[f"pairs_{n}"] = failure(n, error, log)
    except Exception as error:  # noqa: BLE001 - its install or its server: every row says why
        for n in pairs:
            out.setdefault(f"pairs_{n}", failure(n, error, log))
    return out


def failure(pairs: int, error: BaseException, log) -> dict:
    while isinstance(error, BaseExceptionGroup) and error.exceptions:  # the SDK's task groups wrap the cause
        error = error.exceptions[0]
    text = f"{type(error).__name__}: {error}".replace("\n", " ")[:300]
    log(f"  mcp-agent-mail {pairs} pair(s): failed: {text}")
    return {"pairs": pairs, "error": text}


async def phase_agent_mail(url: str, seconds: float, log, pairs: tuple[int, ...] = PAIRS,
                           agent_mail: bool = True) -> dict:
    """``agent_mail=False``: treemail's side alone (the phase's quick test, which installs nothing)."""
    async with serve_treemail(url) as (endpoint, host):
        out = {"treemail": {f"pairs_{n}": await converse(endpoint, host, n, seconds, log, "treemail ") for n in pairs}}
    if agent_mail:
        out["agent_mail"] = await agent_mail_side(seconds, log, pairs)
    return out


if __name__ == "__main__" and sys.argv[1:] == ["install"]:  # `make bench-agentmail`
    print(agent_mail_python(print))
