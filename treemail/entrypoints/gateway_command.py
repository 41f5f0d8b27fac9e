"""`treemail gateway`: serve the host API over HTTP/JSON (``gateway.py``) until Ctrl-C."""

import contextlib
from typing import Annotated

import typer

from .clicommon import ConfigOpt, config_of, url_of
from .httpserve import serve_until_stopped

DEFAULT_GATEWAY_PORT = 8781


def gateway(
    ctx: typer.Context,
    host: Annotated[str, typer.Option(help="address to bind: loopback unless told otherwise (the gateway has no "
                                           "authentication of its own)")] = "127.0.0.1",
    port: Annotated[int, typer.Option(min=0, max=65535, help="port (0: a free one)")] = DEFAULT_GATEWAY_PORT,
    config: ConfigOpt = None,
) -> None:
    """Serve the host API over HTTP/JSON (/v1) for engines in any language; prints its address."""
    from .gateway import Gateway, create_app

    cfg = config_of(ctx, config)
    url_of(cfg)  # no server configured: one line, before anything starts

    @contextlib.asynccontextmanager
    async def opened():
        gate = Gateway(cfg)
        await gate.open()
        try:
            yield create_app(cfg, gate)
        finally:
            await gate.close()

    serve_until_stopped(host, port, opened, lambda address: f"treemail gateway at {address}/v1; Ctrl-C stops it")


def register(app: typer.Typer) -> None:
    app.command()(gateway)
