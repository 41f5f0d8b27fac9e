"""Serving an HTTP app from the CLI until Ctrl-C (`treemail ui`, `treemail gateway`): the socket bound first,
so a taken port is one line, and the address printed once the server answers."""

import asyncio
import socket
from collections.abc import Callable
from contextlib import AbstractAsyncContextManager

import typer

from treemail.domain import limits
from treemail.domain.errors import ConfigError


def query_names_problem(items: list[tuple[str, str]], takes) -> str | None:
    """Why a query is refused by its names (a route's or an operation's): one it does not take (a misspelt name
    would leave its default in force without a word), or one given twice; None: neither."""
    seen = set()
    for name, _ in items:
        if name not in takes:
            return (f"unknown query parameter {limits.shown(name)}: this route takes "
                    f"{', '.join(sorted(takes)) or 'none'}")
        if name in seen:
            return f"query parameter {limits.shown(name)} is given more than once"
        seen.add(name)
    return None


def listen(host: str, port: int) -> socket.socket:
    """The server's socket, bound here so a taken port is one line (uvicorn would exit from inside its task).
    An empty host is refused: it would listen on every interface, and these servers have no login of their own."""
    if not host.strip():
        raise ConfigError("--host is empty: give the address to listen on (0.0.0.0 listens on every interface)")
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    # IPPROTO_TCP named: asyncio sets TCP_NODELAY only on sockets that say they are TCP, and without it a
    # keep-alive client waits out a delayed ACK (about 40 ms) on every answer written in two parts.
    listening = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    listening.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        listening.bind((host.strip("[]"), port))
    except (OSError, UnicodeError) as error:  # taken, not an address here, or a name past DNS's length
        listening.close()
        raise ConfigError(f"cannot listen on {host}:{port}: {getattr(error, 'strerror', None) or error} "
                          "(--port picks another port, 0 a free one)") from None
    listening.listen(128)
    return listening


def serve_until_stopped(host: str, port: int, opened: Callable[[], AbstractAsyncContextManager],
                        announce: Callable[[str], str]) -> None:
    """Serve the app ``opened()`` yields (its parts open, closed after) on ``host:port`` until Ctrl-C;
    ``announce(address)`` is the line printed once it answers. A server that never started exits 1."""
    import uvicorn

    async def serve() -> bool:
        async with opened() as app:  # an unreachable server is one line, not a failed startup's traceback
            # Open event streams and long polls end within a second of Ctrl-C instead of holding the shutdown.
            server = uvicorn.Server(uvicorn.Config(app, host=host, port=port, log_level="warning",
                                                   timeout_graceful_shutdown=1))
            listening = listen(host, port)
            task = asyncio.create_task(server.serve(sockets=[listening]))
            while not server.started and not task.done():
                await asyncio.sleep(0.05)
            if server.started:
                address = listening.getsockname()
                shown = f"[{address[0]}]" if ":" in address[0] else address[0]
                print(announce(f"http://{shown}:{address[1]}"), flush=True)
            await task
            return server.started

    try:
        started = asyncio.run(serve())
    except KeyboardInterrupt:  # uvicorn stops on Ctrl-C, then raises it again: a clean stop
        started = True
    if not started:
        raise typer.Exit(1)
