"""A host process that kills itself (SIGKILL, as kill -9) before its (N+1)th append: one finish_run or dispose,
a cancel (SESSION_ID is then the message id), a claim whose deliveries it consumes, or a cascading stop of
SESSION_ID's subtree (RUN_ID is then the stop's idempotency key).

``python -m tests.faults.hostkill URL finish|dispose|cancel|claim|stop SESSION_ID RUN_ID N``. The appends are the points of the
operation where a dying host could leave part of it done: each is one atomic step, so "before append N+1"
covers every point between two steps, and N past the last append lets the operation complete.
"""

import asyncio
import os
import signal
import sys

from tests.integration.conftest import make_config
from treemail.adapters.eventstore import EventStore
from treemail.host import Treemail


ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


async def run_host(url: str, operation: str, target: str, run_id: str, after: int) -> int:
    """Run this module as a host process that dies before its append ``after`` + 1 (or completes); its exit code
    (-SIGKILL when it died)."""
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "tests.faults.hostkill", url, operation, target, run_id, str(after), cwd=ROOT,
        stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE)
    _, err = await asyncio.wait_for(process.communicate(), 120)
    assert process.returncode in (0, -signal.SIGKILL), err.decode()[-2000:]
    return process.returncode


def die_before_append(after: int) -> None:
    done = 0
    original = EventStore.append

    async def append(self, prepared):
        nonlocal done
        if done >= after:
            os.kill(os.getpid(), signal.SIGKILL)
        done += 1
        return await original(self, prepared)

    EventStore.append = append


async def main(url: str, operation: str, session_id: str, run_id: str, after: int) -> None:
    host = await Treemail.connect(make_config(url), url)
    die_before_append(after)
    try:
        if operation == "finish":
            await host.finish_run(session_id, run_id, "completed", "closing words")
        elif operation == "cancel":
            await host.obligations.cancel(session_id)
        elif operation == "stop":
            await host.disposal.stop_subtree(session_id, "dispose", idempotency_key=run_id)
        elif operation == "claim":
            for delivery in await host.claim(session_id, run_id):
                await host.consume(session_id, delivery.message_id)
        else:
            await host.disposal.dispose(session_id, "aborted", "stopped early")
    finally:
        await host.close()


if __name__ == "__main__":
    url, operation, session_id, run_id, after = sys.argv[1:]
    asyncio.run(main(url, operation, session_id, run_id, int(after)))
