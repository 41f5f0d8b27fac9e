"""The stdio transport: the SDK's, with every line judged first (``framing.py``), so every request is answered.

The SDK reads the lines this hands it, which are all messages it can read; a
line it could not read is answered here with its JSON-RPC error, written
through the SDK's own writer (one writer: frames never tear), and the server
goes on to the next line.
"""

import contextlib
import sys

import anyio
import mcp_types as types
from mcp.server.stdio import stdio_server
from mcp.shared.message import SessionMessage

from . import framing

# Refusals waiting for the writer; past it, reading waits for the writer (a client flooding bad lines is slowed).
PENDING_REFUSALS = 64


class CheckedLines:
    """The client's lines as the SDK's stdio reader iterates them; the refused ones go to ``refusals``."""

    def __init__(self, source, refusals) -> None:
        self._source = source
        self._refusals = refusals

    def __aiter__(self):
        return self._lines()

    async def _lines(self):
        async with self._refusals:
            async for raw in self._source:
                judged = framing.judge(raw)
                if isinstance(judged, framing.Refusal):
                    await self._refusals.send(judged)
                elif judged is not None:
                    yield judged + "\n"


async def _answer(refusals, write_stream) -> None:
    with contextlib.suppress(anyio.ClosedResourceError, anyio.BrokenResourceError):
        async for refusal in refusals:
            error = types.ErrorData(code=refusal.code, message=refusal.message)
            await write_stream.send(SessionMessage(types.JSONRPCError(jsonrpc="2.0", id=refusal.id, error=error)))


@contextlib.asynccontextmanager
async def checked_stdio_server():
    """``(read_stream, write_stream)`` over stdin and stdout, as ``mcp.server.stdio.stdio_server`` yields them."""
    refusals_in, refusals_out = anyio.create_memory_object_stream[framing.Refusal](PENDING_REFUSALS)
    lines = CheckedLines(anyio.wrap_file(sys.stdin.buffer), refusals_in)
    async with stdio_server(stdin=lines) as (read_stream, write_stream):
        async with anyio.create_task_group() as tasks:
            tasks.start_soon(_answer, refusals_out, write_stream)
            yield read_stream, write_stream
            tasks.cancel_scope.cancel()
