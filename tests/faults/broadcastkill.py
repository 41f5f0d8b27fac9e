"""A host process that kills itself (SIGKILL, as kill -9) in the middle of a subtree broadcast's fan-out.

``python -m tests.faults.broadcastkill URL SESSION_ID KEY N``: the broadcast from SESSION_ID's open run under
the idempotency key KEY, the process killed as the Nth copy's answer arrives (the other copies in flight may or
may not have been decided by then: either way the resumption must not send one twice).
"""

import asyncio
import os
import signal
import sys

from tests.integration.conftest import make_config
from treemail.host import Treemail
from treemail.producers.host.sending import Sending


def die_at_answer(after: int) -> None:
    answered = 0
    original = Sending.send_message  # the one sending path every copy of a broadcast takes

    async def send_message(self, context, arguments, **options):
        nonlocal answered
        result = await original(self, context, arguments, **options)
        answered += 1
        if answered >= after:
            os.kill(os.getpid(), signal.SIGKILL)
        return result

    Sending.send_message = send_message


async def main(url: str, session_id: str, key: str, after: int) -> None:
    die_at_answer(after)
    host = await Treemail.connect(make_config(url), url)
    try:
        await host.peers.broadcast_subtree(session_id, "stop and report", idempotency_key=key)
    finally:
        await host.close()


if __name__ == "__main__":
    url, session_id, key, after = sys.argv[1:]
    asyncio.run(main(url, session_id, key, int(after)))
