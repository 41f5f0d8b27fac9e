"""A real stack for the contract: Valkey, a worker, and the host gateway on a free loopback port.

In a test: ``async with gateway_stack(url) as (tm, base_url)``. For the TypeScript suite, a process:
``python -m tests.contract.stack`` starts its own Valkey too, prints ``TREEMAIL_GATEWAY_URL=<url>`` once
everything listens, and stops when its standard input closes (the test that started it ended or died).
"""

import asyncio
import contextlib
import os
import signal
import socket
import sys

import uvicorn

from treemail.adapters.config import Config, ServiceConfig
from treemail.consumers.app import Worker
from treemail.entrypoints.gateway import Gateway, create_app
from treemail.host import Treemail


def stack_config(url: str) -> Config:
    return Config(service=ServiceConfig(redis_url=url, command_streams=1, partitions=4, reclaim_idle_ms=500))


@contextlib.asynccontextmanager
async def gateway_stack(url: str, config: Config | None = None):
    """A worker and a gateway on ``url``; yields the gateway's host API and its base URL."""
    config = config or stack_config(url)
    worker = Worker(config, url, consumer="contract-worker")
    await worker.start()
    tm = await Treemail.connect(config, url)
    listening = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)  # TCP_NODELAY: see listen()
    listening.bind(("127.0.0.1", 0))
    listening.listen(128)
    server = uvicorn.Server(uvicorn.Config(create_app(config, Gateway(config, tm)), log_level="warning",
                                           timeout_graceful_shutdown=1))
    task = asyncio.create_task(server.serve(sockets=[listening]))
    try:
        while not server.started and not task.done():
            await asyncio.sleep(0.02)
        yield tm, f"http://127.0.0.1:{listening.getsockname()[1]}"
    finally:
        server.should_exit = True
        await task
        listening.close()
        await tm.close()
        await worker.stop()


async def serve_until_stdin_closes() -> None:
    from treemail.adapters.embedded import LocalValkey

    valkey = LocalValkey().start()
    try:
        async with gateway_stack(valkey.url) as (_, base_url):
            print(f"TREEMAIL_GATEWAY_URL={base_url}", flush=True)
            # Stop on end of input or on SIGTERM, either way through the cleanup (the Valkey is a child process).
            stopped = asyncio.Event()
            asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stopped.set)
            closed = asyncio.ensure_future(asyncio.to_thread(_until_end_of_input))
            await asyncio.wait([closed, asyncio.ensure_future(stopped.wait())], return_when=asyncio.FIRST_COMPLETED)
    finally:
        valkey.cleanup()
    os._exit(0)  # the thread still reading standard input must not hold the exit


def _until_end_of_input() -> None:
    while sys.stdin.buffer.read1(4096):
        pass


if __name__ == "__main__":
    asyncio.run(serve_until_stdin_closes())
