"""`treemail gateway`: the host API over HTTP/JSON, for an engine in any language (starlette).

A thin adapter: each route (``gatewayops.OPERATIONS``) parses its strict body, makes one host API call and
answers with what the host API answered. Errors are the host's stable codes in one shape,
``{"error": {"code", "message", ...}}``, with a status derived from the code (``gatewaywire.status_of``)
and ``Retry-After`` where the refusal says when. Every answer names the gateway's version and the event
protocol's in headers. Like `treemail ui`, it binds loopback unless told otherwise; it has no
authentication of its own, so an operator who binds it elsewhere puts it behind one.
"""

import asyncio
import contextlib
import json
import logging
import math

from pydantic import ValidationError
from redis.exceptions import RedisError
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from treemail.adapters import keys
from treemail.adapters.config import Config
from treemail.domain.errors import LifecycleError, RedisUnavailable, TreemailError, UnknownSessionError
from treemail.domain.limits import IdentifierError
from treemail.domain.protocol import PROTOCOL_VERSION
from treemail.host import Treemail

from . import gatewaywire as w
from .gatewayops import OPERATIONS, Call, Operation, Query

log = logging.getLogger("treemail.gateway")

HEADERS = {w.VERSION_HEADER: str(w.GATEWAY_VERSION), w.PROTOCOL_HEADER: str(PROTOCOL_VERSION)}


class RequestTooLarge(TreemailError):
    code = w.TOO_LARGE


def answer(body: dict, status: int = 200) -> JSONResponse:
    headers = dict(HEADERS)
    retry_after = (body.get("error") or {}).get("retry_after_ms") if status != 200 else None
    if retry_after is not None:
        headers["Retry-After"] = str(max(1, math.ceil(retry_after / 1000)))
    return JSONResponse(body, status_code=status, headers=headers)


def refusal(code: str, message: str) -> JSONResponse:
    body = w.error_body(code, message)
    return answer(body, w.status_of(body["error"]))


def _validation_message(error: ValidationError) -> str:
    first = error.errors()[0]
    where = ".".join(str(part) for part in first["loc"]) or "the body"
    return f"{where}: {first['msg']} ({error.error_count()} problem(s) in the request)"


def _query(request: Request, spec: Query):
    raw = request.query_params.get(spec.name)
    if raw is None:
        if spec.required:
            raise ValueError(f"the query parameter {spec.name} is required")
        return spec.default
    if spec.kind is int:
        if not raw.isdigit():
            raise ValueError(f"{spec.name} must be a non-negative integer, got {raw!r}")
        value = int(raw)
        if (spec.minimum is not None and value < spec.minimum) or (spec.maximum is not None and value > spec.maximum):
            raise ValueError(f"{spec.name} must be between {spec.minimum} and {spec.maximum}, got {value}")
        return value
    return raw


class Gateway:
    """The routes over one host connection, opened at startup (or handed in, already connected)."""

    def __init__(self, config: Config, host: Treemail | None = None) -> None:
        self.config = config
        self.host = host
        self._owns_host = host is None
        self._polls = 0  # long polls waiting now
        self.wake_streams = frozenset(keys.wake_stream(p) for p in range(config.service.partitions))

    async def open(self) -> None:
        if self.host is None:
            self.host = await Treemail.connect(self.config, self.config.service.redis_url)

    async def close(self) -> None:
        if self.host is not None and self._owns_host:
            await self.host.close()
            self.host = None

    @contextlib.asynccontextmanager
    async def lifespan(self, app):
        await self.open()
        try:
            yield
        finally:
            await self.close()

    def endpoint(self, operation: Operation):
        async def handle(request: Request) -> Response:
            try:
                body = await self._body(request, operation)
                query = {spec.name: _query(request, spec) for spec in operation.query}
            except RequestTooLarge as error:
                return refusal(w.TOO_LARGE, str(error))
            except (ValueError, ValidationError) as error:
                message = _validation_message(error) if isinstance(error, ValidationError) else str(error)
                return refusal(w.INVALID_REQUEST, message)
            call = Call(self.host, dict(request.path_params), body, query, self.wake_streams)
            if operation.long_poll:
                if self._polls >= w.MAX_LONG_POLLS:
                    return answer({"error": {"code": w.TOO_MANY_POLLS, "retry_after_ms": w.POLL_RETRY_AFTER_MS,
                                             "message": f"{w.MAX_LONG_POLLS} long polls are waiting here already"}},
                                  429)
                self._polls += 1
                try:
                    return await self._unless_gone(request, self._run(operation, call))
                finally:
                    self._polls -= 1
            return await self._run(operation, call)

        handle.__name__ = operation.id
        return handle

    async def _body(self, request: Request, operation: Operation):
        if operation.request is None:
            return None
        raw = bytearray()
        async for chunk in request.stream():
            raw += chunk
            if len(raw) > w.MAX_REQUEST_BYTES:
                raise RequestTooLarge(f"the body is over {w.MAX_REQUEST_BYTES:,} bytes")
        try:
            data = json.loads(raw) if raw.strip() else {}
        except ValueError:
            raise ValueError("the body is not JSON") from None
        if not isinstance(data, dict):
            raise ValueError("the body must be a JSON object")
        return operation.request.model_validate(data)

    async def _unless_gone(self, request: Request, work) -> Response:
        """A long poll the client gave up on (its AbortSignal, a closed connection) stops waiting at once: it
        would hold a server connection for the rest of its block_ms. A trigger it had already read stays
        pending in the runners' group and is reclaimed by another read, as a dead runner's is."""

        async def gone() -> None:
            while (await request.receive())["type"] != "http.disconnect":
                pass

        running, watching = asyncio.ensure_future(work), asyncio.ensure_future(gone())
        await asyncio.wait({running, watching}, return_when=asyncio.FIRST_COMPLETED)
        if running.done():
            watching.cancel()
            return running.result()
        running.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await running
        return Response(status_code=499)  # nobody reads it: the client is gone

    async def _run(self, operation: Operation, call: Call) -> Response:
        """The host API's answer, or its error in the one shape: what the Python host raises or returns."""
        try:
            result = await operation.run(call)
        except (LifecycleError, IdentifierError) as error:
            return refusal(error.code, error.message)
        except UnknownSessionError as error:
            return refusal("lifecycle:unknown_session", str(error))
        except (RedisError, RedisUnavailable, OSError) as error:
            return refusal(w.UNAVAILABLE, f"the server could not be reached ({type(error).__name__}); "
                                          "retrying is safe where the operation is idempotent")
        except LookupError as error:  # what the host API finds nothing under (an approval request's id)
            return refusal(w.NOT_FOUND, str(error))
        except ValueError as error:  # what the host API refuses a caller's value with
            return refusal(w.INVALID_REQUEST, str(error))
        except Exception:
            log.exception("gateway: %s failed", operation.id)
            return refusal(w.INTERNAL, f"{operation.id} failed inside the gateway; its log says why")
        if "error" in result:
            return answer(result, w.status_of(result["error"]))
        return answer(result)


async def not_found(request: Request, exc) -> Response:
    if getattr(exc, "status_code", 404) == 405:
        return refusal(w.NOT_FOUND, f"{request.method} is not an operation of {request.url.path}")
    return refusal(w.NOT_FOUND, f"no operation at {request.url.path} (this gateway serves {w.PREFIX})")


def create_app(config: Config, gateway: Gateway | None = None) -> Starlette:
    gateway = gateway or Gateway(config)
    routes = [Route(w.PREFIX + op.path, gateway.endpoint(op), methods=[op.method], name=op.id) for op in OPERATIONS]
    return Starlette(routes=routes, lifespan=gateway.lifespan, exception_handlers={404: not_found, 405: not_found})
