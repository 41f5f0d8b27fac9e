"""`treemail gateway`: serve the host API over HTTP/JSON (``gateway.py``) until Ctrl-C."""

from typing import Annotated

import typer

from .clicommon import ConfigOpt, config_of, url_of
from .timeline_commands import listen

DEFAULT_GATEWAY_PORT = 8781


def gateway(
    ctx: typer.Context,
    host: Annotated[str, typer.Option(help="address to bind: loopback unless told otherwise (the gateway has no "
                                           "authentication of its own)")] = "127.0.0.1",
    port: Annotated[int, typer.Option(min=0, max=65535, help="port (0: a free one)")] = DEFAULT_GATEWAY_PORT,
    config: ConfigOpt = None,
) -> None:
    """Serve the host API over HTTP/JSON (/v1) for engines in any language; prints its address."""
    import asyncio

    import uvicorn

    from .gateway import Gateway, create_app

    cfg = config_of(ctx, config)
    url_of(cfg)  # no server configured: one line, before anything starts

    async def serve() -> bool:
        gate = Gateway(cfg)
        await gate.open()  # an unreachable server is one line, not a failed startup's traceback
        app = create_app(cfg, gate)
        server = uvicorn.Server(uvicorn.Config(app, host=host, port=port, log_level="warning",
                                               timeout_graceful_shutdown=1))
        try:
            listening = listen(host, port)
            task = asyncio.create_task(server.serve(sockets=[listening]))
            while not server.started and not task.done():
                await asyncio.sleep(0.05)
            if server.started:
                address = listening.getsockname()
                shown = f"[{address[0]}]" if ":" in address[0] else address[0]
                print(f"treemail gateway at http://{shown}:{address[1]}/v1; Ctrl-C stops it", flush=True)
            await task
            return server.started
        finally:
            await gate.close()

    try:
        started = asyncio.run(serve())
    except KeyboardInterrupt:  # uvicorn stops on Ctrl-C, then raises it again: a clean stop
        started = True
    if not started:
        raise typer.Exit(1)


def register(app: typer.Typer) -> None:
    app.command()(gateway)
