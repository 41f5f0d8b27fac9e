"""The streamable HTTP transport with every body judged as a stdio line is (``framing.judge``), before the SDK reads it.

The SDK's HTTP transport answered a body by rules of its own: a lone
surrogate was a parse error there (-32700) and a JSON-RPC object that is no
message was invalid params (-32602), where stdio answers -32602 and -32600,
so a client's error depended on the transport it spoke. Here one rule holds
for both: a body the judge refuses is answered with its JSON-RPC error (HTTP
400, or 413 for one over the size bound) and the request's id; a body it
accepts reaches the SDK as the judge wrote it out; a notification or a
response it drops is accepted (202), as JSON-RPC answers neither. An empty body is the SDK's to answer (-32700): it
names no message at all.
"""

from starlette.responses import JSONResponse, Response
from starlette.types import ASGIApp, Receive, Scope, Send

from . import framing


class CheckedBodies:
    """An ASGI app in front of the SDK's endpoint (behind its bearer check, so a stranger is refused first):
    each POST body judged, every other request passed on."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] != "POST":
            await self.app(scope, receive, send)
            return
        body = await _body(receive)
        judged = framing.judge(body) if body.strip() else body
        if isinstance(judged, framing.Refusal):
            error = {"jsonrpc": "2.0", "id": judged.id, "error": {"code": judged.code, "message": judged.message}}
            too_large = len(body) > framing.MAX_FRAME_BYTES
            await JSONResponse(error, status_code=413 if too_large else 400)(scope, receive, send)
        elif judged is None:
            await Response(status_code=202)(scope, receive, send)
        else:
            body = judged.encode() if isinstance(judged, str) else judged
            await self.app(_with_length(scope, len(body)), _replay(body, receive), send)


async def _body(receive: Receive) -> bytes:
    """The body, or its first ``MAX_FRAME_BYTES`` and more once it is over them (never held whole)."""
    chunks, size = [], 0
    while size <= framing.MAX_FRAME_BYTES:
        message = await receive()
        if message["type"] != "http.request":  # the client left before its body ended
            break
        chunks.append(message.get("body", b""))
        size += len(chunks[-1])
        if not message.get("more_body", False):
            break
    return b"".join(chunks)


def _replay(body: bytes, receive: Receive) -> Receive:
    """The judged body as the one message of the request, then the client's own messages (its disconnect)."""
    sent = False

    async def replayed():
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return replayed


def _with_length(scope: Scope, length: int) -> Scope:
    headers = [(k, v) for k, v in scope["headers"] if k != b"content-length"]
    return {**scope, "headers": [*headers, (b"content-length", str(length).encode())]}
