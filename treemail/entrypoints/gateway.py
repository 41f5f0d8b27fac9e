"""`treemail gateway`: the host API over HTTP/JSON, for an engine in any language (starlette).

A thin adapter: each route (``gatewayops.OPERATIONS``) parses its strict body, makes one host API call and
answers with what the host API answered. Errors are the host's stable codes in one shape,
``{"error": {"code", "message", ...}}``, with a status derived from the code (``gatewaywire.status_of``)
and ``Retry-After`` where the refusal says when. Every answer names the gateway's version and the event
protocol's in headers. Like `treemail ui`, it binds loopback unless told otherwise; it has no
authentication of its own, so an operator who binds it elsewhere puts it behind one.

Wakes and interrupts also come as server-sent events (``follow``), resumed after the ``Last-Event-ID`` a
reconnecting client names. ``/healthz`` and ``/readyz`` answer as a worker's do (``adapters.health``).
"""

import asyncio
import contextlib
import dataclasses
import json
import logging
import math
from urllib.parse import unquote

from pydantic import ValidationError
from redis.exceptions import RedisError
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from starlette.routing import Route

from treemail.adapters import keys
from treemail.adapters.config import Config
from treemail.adapters.health import Health, OutageLog, watch
from treemail.domain import limits
from treemail.domain.errors import RedisUnavailable, TreemailError, UnknownSessionError
from treemail.domain.protocol import PROTOCOL_VERSION
from treemail.host import Treemail

from . import gatewaywire as w
from .gatewayops import OPERATIONS, Call, Operation, Query
from .httpserve import query_names_problem

log = logging.getLogger("treemail.gateway")

HEADERS = {w.VERSION_HEADER: str(w.GATEWAY_VERSION), w.PROTOCOL_HEADER: str(PROTOCOL_VERSION)}


# A number in a query (a count, a wait) is far below this; a longer one is refused before it is read.
MAX_QUERY_DIGITS = 18


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


def _queries(request: Request, specs: tuple[Query, ...]) -> dict:
    """The operation's query parameters, each given at most once; a name it does not take is refused (a
    misspelt ``blockms`` would otherwise leave the default in force without a word)."""
    if (names := query_names_problem(request.query_params.multi_items(), {spec.name for spec in specs})):
        raise ValueError(names)
    return {spec.name: _query(request, spec) for spec in specs}


def _query(request: Request, spec: Query):
    raw = request.query_params.get(spec.name)
    if raw is None:
        if spec.required:
            raise ValueError(f"the query parameter {spec.name} is required")
        return spec.default
    if spec.kind is int:
        if not (raw.isascii() and raw.isdigit() and len(raw) <= MAX_QUERY_DIGITS):
            raise ValueError(f"{spec.name} must be a non-negative integer of at most {MAX_QUERY_DIGITS} digits, "
                             f"got {limits.shown(raw)}")
        value = int(raw)
        if (spec.minimum is not None and value < spec.minimum) or (spec.maximum is not None and value > spec.maximum):
            raise ValueError(f"{spec.name} must be between {spec.minimum} and {spec.maximum}, got {value}")
        return value
    # A name or an id: kept (a consumer's name in the runners' groups) or looked up, bounded as the body's are.
    return limits.require_id(spec.name, raw)


class Gateway:
    """The routes over one host connection, opened at startup (or handed in, already connected)."""

    def __init__(self, config: Config, host: Treemail | None = None) -> None:
        self.config = config
        self.host = host
        self._owns_host = host is None
        self._waiting = 0  # long polls and event streams waiting now
        self.partitions = config.service.partitions
        self.wake_streams = frozenset(keys.wake_stream(p) for p in range(self.partitions))
        self._partition_of = {keys.wake_stream(p): p for p in range(self.partitions)}
        self.health = Health()
        self.closing = False

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
        watching = asyncio.create_task(watch(self.health, self.host.obligations.probe, OutageLog(log), lambda: self.closing))
        try:
            yield
        finally:
            # Not ready first, so a balancer stops sending before anything closes.
            self.closing = True
            self.health.set(False, "stopping")
            watching.cancel()
            await asyncio.gather(watching, return_exceptions=True)
            await self.close()

    async def healthz(self, request: Request) -> Response:
        return _probe_answer(*self.health.alive())

    async def readyz(self, request: Request) -> Response:
        return _probe_answer(*self.health.readiness())

    def endpoint(self, operation: Operation):
        async def handle(request: Request) -> Response:
            try:
                body = await self._body(request, operation)
                query = _queries(request, operation.query)
            except ClientDisconnect:
                return Response(status_code=499)  # gone before its body arrived: nobody reads an answer
            except RequestTooLarge as error:
                return refusal(w.TOO_LARGE, str(error))
            except limits.IdentifierError as error:
                return refusal(error.code, error.message)
            except (ValueError, ValidationError) as error:
                message = _validation_message(error) if isinstance(error, ValidationError) else str(error)
                return refusal(w.INVALID_REQUEST, message)
            path = {name: unquote(value) for name, value in request.path_params.items()}  # see KeepSlashes
            call = Call(self.host, path, body, query, self.wake_streams)
            if operation.events is not None:
                return self._follow(request, operation, call)
            if operation.long_poll:
                if (refused := self._no_room(w.TOO_MANY_POLLS, "long polls")) is not None:
                    return refused
                self._waiting += 1
                try:
                    return await self._unless_gone(request, self._run(operation, call))
                finally:
                    self._waiting -= 1
            return await self._run(operation, call)

        handle.__name__ = operation.id
        return handle

    def _no_room(self, code: str, what: str) -> Response | None:
        if self._waiting < w.MAX_WAITING_READS:
            return None
        return answer({"error": {"code": code, "retry_after_ms": w.POLL_RETRY_AFTER_MS,
                                 "message": f"{w.MAX_WAITING_READS} long polls and event streams are waiting here "
                                            f"already: no room for more {what}"}}, 429)

    def _follow(self, request: Request, operation: Operation, call: Call) -> Response:
        """An event stream: what was read for this runner and never reached it (after ``Last-Event-ID``), then
        each trigger as it comes, a heartbeat comment whenever a read waited its time for none. Each event's
        id is the stream's position after it; a client that reconnects with it misses nothing and gets
        nothing twice. It holds a pooled connection as a long poll does, and counts against the same bound."""
        try:
            position = w.parse_position(request.headers.get("last-event-id", ""), self.partitions)
        except ValueError as error:
            return refusal(w.INVALID_REQUEST, str(error))
        if (refused := self._no_room(w.TOO_MANY_STREAMS, "event streams")) is not None:
            return refused
        call = dataclasses.replace(call, after={keys.wake_stream(p): entry for p, entry in position.items()})
        self._waiting += 1

        sent = w.Sent(position)

        async def events():
            try:
                yield f"retry: {w.RECONNECT_MS}\n: following {operation.events}s\n\n"
                async for trigger in operation.run(call):
                    if self.closing or stream.gone:
                        return
                    if trigger is None:
                        yield ": heartbeat\n\n"
                        continue
                    event_id = sent.add(self._partition_of[trigger.stream], trigger.entry_id)
                    if event_id is None:
                        # Its own, unacknowledged a while, claimed again: it has it. Said as a heartbeat, so a
                        # stream whose reads only find these still says something.
                        yield ": heartbeat\n\n"
                        continue
                    yield w.sse_event(operation.events, event_id, dataclasses.asdict(trigger))
            except (RedisError, RedisUnavailable, OSError) as error:
                # Said once, then the stream ends: the client reconnects after the last id it received.
                body = w.error_body(w.UNAVAILABLE, f"the server could not be reached ({type(error).__name__})")
                yield f"event: error\ndata: {json.dumps(body)}\n\n"

        def release() -> None:
            self._waiting -= 1

        stream = EventStream(events(), release)
        return stream

    async def _body(self, request: Request, operation: Operation):
        if operation.request is None:
            return None
        raw = bytearray()
        async for chunk in request.stream():
            raw += chunk
            if len(raw) > w.MAX_REQUEST_BYTES:
                raise RequestTooLarge(f"the body is over {w.MAX_REQUEST_BYTES:,} bytes")
        if not raw.strip():
            # Every operation with a body documents it as required: {} takes every default, and an empty
            # body is not read as a wish for them (an empty drain would drain the whole service).
            raise ValueError("the body is required: a JSON object ({} takes every default)")
        if limits.nesting_depth(raw.decode("utf-8", "replace")) > limits.MAX_JSON_DEPTH:
            raise ValueError(f"the body nests deeper than {limits.MAX_JSON_DEPTH} levels")
        try:
            data = json.loads(raw)
        except (ValueError, RecursionError):
            raise ValueError("the body is not JSON") from None
        if not isinstance(data, dict):
            raise ValueError("the body must be a JSON object")
        return operation.request.model_validate(data)

    async def _unless_gone(self, request: Request, work) -> Response:
        """A long poll the client gave up on (its AbortSignal, a closed connection) stops waiting at once: it
        would hold a server connection for the rest of its block_ms. A trigger it had already read stays
        pending in the runners' group and is reclaimed by another read, as a dead runner's is."""
        running = asyncio.ensure_future(work)
        if await until_gone(request.receive, running):
            return Response(status_code=499)  # nobody reads it: the client is gone
        return running.result()

    async def _run(self, operation: Operation, call: Call) -> Response:
        """The host API's answer, or its error in the one shape: what the Python host raises or returns."""
        try:
            result = await operation.run(call)
        except UnknownSessionError as error:
            return refusal("lifecycle:unknown_session", str(error))
        except (RedisError, RedisUnavailable, OSError) as error:
            return refusal(w.UNAVAILABLE, f"the server could not be reached ({type(error).__name__}); "
                                          "retrying is safe where the operation is idempotent")
        except TreemailError as error:  # the host's own code, the one a Python host would catch
            code = getattr(error.code, "value", error.code)
            return refusal(code or w.INVALID_REQUEST, getattr(error, "message", "") or str(error))
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


async def until_gone(receive, running: asyncio.Future, noticed=lambda: None) -> bool:
    """Wait for ``running``, or when the client disconnects first call ``noticed``, cancel it and wait for it
    to end (then True). A read of the server may survive its cancellation (a timeout at the same moment is
    raised, and retried, instead), so what ``running`` does must also end on its own once told."""

    async def gone() -> None:
        while (await receive())["type"] != "http.disconnect":
            pass

    watching = asyncio.ensure_future(gone())
    await asyncio.wait({running, watching}, return_when=asyncio.FIRST_COMPLETED)
    if running.done():
        watching.cancel()
        return False
    noticed()
    running.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await running
    return True


class EventStream(StreamingResponse):
    """Server-sent events that stop reading for a client as soon as it goes away: a write to a closed connection
    raises nothing, so without this a stream would read triggers for nobody until the gateway stops. Its
    events end at ``gone`` (its read is also cancelled; at the latest the read ends after a heartbeat's
    time). ``release`` once it ended: it held a pooled server connection."""

    def __init__(self, events, release) -> None:
        super().__init__(events, media_type="text/event-stream",
                         headers={**HEADERS, "Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
        self._release = release
        self.gone = False

    async def __call__(self, scope, receive, send) -> None:
        streaming = asyncio.ensure_future(self.stream_response(send))
        try:
            if not await until_gone(receive, streaming, self._noticed) and streaming.exception() is not None:
                log.debug("event stream ended: %s", streaming.exception())
        finally:
            self._release()

    def _noticed(self) -> None:
        self.gone = True


def _probe_answer(ok: bool, why: str) -> Response:
    return PlainTextResponse(f"{why}\n", status_code=200 if ok else 503)


class KeepSlashes:
    """Route on the path as the client encoded it, so an id holding "/" (sent as %2F) stays one segment.

    The server hands the app a decoded path, in which ``a%2Fb`` and ``a/b`` are the same: routed on it, an id
    holding "/" would reach another route or none. Each segment of the raw path is decoded here and only
    "%" and "/" escaped again; ``Gateway.endpoint`` decodes each path value once, so any id comes back as the
    client sent it."""

    def __init__(self, app) -> None:
        self.app = app

    async def __call__(self, scope, receive, send) -> None:
        raw = scope.get("raw_path") if scope["type"] == "http" else None
        if raw is not None:
            segments = raw.decode("utf-8", "replace").split("/")
            path = "/".join(unquote(s).replace("%", "%25").replace("/", "%2F") for s in segments)
            scope = {**scope, "path": scope.get("root_path", "") + path}
        await self.app(scope, receive, send)


async def not_found(request: Request, exc) -> Response:
    if getattr(exc, "status_code", 404) == 405:
        return refusal(w.NOT_FOUND, f"{request.method} is not an operation of {request.url.path}")
    return refusal(w.NOT_FOUND, f"no operation at {request.url.path} (this gateway serves {w.PREFIX})")


def create_app(config: Config, gateway: Gateway | None = None) -> Starlette:
    gateway = gateway or Gateway(config)
    routes = [Route(w.PREFIX + op.path, gateway.endpoint(op), methods=[op.method], name=op.id) for op in OPERATIONS]
    routes += [Route("/healthz", gateway.healthz, methods=["GET"]), Route("/readyz", gateway.readyz, methods=["GET"])]
    return Starlette(routes=routes, lifespan=gateway.lifespan, middleware=[Middleware(KeepSlashes)],
                     exception_handlers={404: not_found, 405: not_found})
