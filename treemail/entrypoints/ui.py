"""`treemail ui`: the mailbox time-travel page (starlette), over the host API and the server's streams.

The page (``ui_static/``: one HTML file, one small script, one stylesheet, checked in, no build step) reads
JSON from the routes below and follows the partition feeds over server-sent events while the stack runs.
Reads are open to whoever reaches the address, which is loopback unless the operator binds it elsewhere;
on loopback only requests naming a loopback host are answered, so a web page elsewhere cannot read it
through a rebound DNS name. Write actions (retry a parked message, approve or deny a waiting send) need
the operator's token as ``Authorization: Bearer <token>``: a header, which a page on another site cannot
make a browser send, unlike a cookie. Without a token configured the page is read-only.
"""

import contextlib
import hmac
import json
from importlib import resources

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.middleware.trustedhost import TrustedHostMiddleware
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from treemail.adapters.config import Config
from treemail.adapters.connection import connect
from treemail.adapters.eventstore import EventStore
from treemail.domain import limits
from treemail.domain.errors import TreemailError, UnknownSessionError
from treemail.domain.results import clip
from treemail.host import Treemail
from treemail.projections import mailboxes
from treemail.projections import timeline as tl

from .gatewaywire import status_of
from .httpserve import query_names_problem

STATIC = {
    "index.html": "text/html; charset=utf-8",
    "app.js": "text/javascript; charset=utf-8",
    "app.css": "text/css; charset=utf-8",
}
LOOPBACK_HOSTS = ["127.0.0.1", "localhost", "::1", "[::1]"]


def _static(name: str) -> bytes:
    return resources.files(__package__).joinpath("ui_static", name).read_bytes()


# An error names what it could not find in at most this many characters: a 5,000-character id is not echoed.
MAX_ECHO = 160


def _error(status: int, code: str, message: str) -> JSONResponse:
    return JSONResponse({"error": {"code": code, "message": message}}, status_code=status)


def _coded(error: TreemailError) -> JSONResponse:
    """A host API refusal with its own stable code (``approval:unknown_request``, ``identifier:too_long``), and
    the status the gateway answers it with."""
    code = getattr(error.code, "value", error.code)
    return _error(status_of({"code": code}), code, getattr(error, "message", "") or str(error))


async def _route_error(request: Request, error: HTTPException) -> JSONResponse:
    """An unknown route or a method a route does not take, in the page's one error shape."""
    code = "ui:not_found" if error.status_code == 404 else "ui:method_not_allowed" if error.status_code == 405 \
        else "ui:invalid_request"
    return JSONResponse({"error": {"code": code, "message": f"{request.method} {limits.shown(request.url.path)}: "
                                                            f"{error.detail}"}},
                        status_code=error.status_code, headers=error.headers)


# A position in a stream: ASCII digits only (``"²".isdigit()`` is true, and ``int("²")`` fails), at most 18 of them.
MAX_POSITION_DIGITS = 18


def query_problem(items: list[tuple[str, str]], takes: tuple[str, ...] = ()) -> tuple[str, str] | None:
    """Why (a code and a message) a route that takes the query parameters ``takes`` refuses this query; None:
    it does not."""
    if (names := query_names_problem(items, takes)) is not None:
        return "ui:invalid_query", names
    for name, value in items:
        if name == "at" and not (value.isascii() and value.isdigit() and len(value) <= MAX_POSITION_DIGITS):
            return "ui:invalid_position", (f"at must be one non-negative integer (a stream position) of at most "
                                           f"{MAX_POSITION_DIGITS} digits, got {value!r}")
    return None


def _refused_query(request: Request, takes: tuple[str, ...] = ()) -> JSONResponse | None:
    problem = query_problem(request.query_params.multi_items(), takes)
    return None if problem is None else _error(400, *problem)


def _position_refused(request: Request, last: int) -> JSONResponse | None:
    """``at`` (well formed: ``query_problem``) within the session's history, 0..``last``."""
    at = request.query_params.get("at")
    if at is not None and int(at) > last:
        return _error(400, "ui:invalid_position", f"position {int(at)} is not in the session's history (0..{last})")
    return None


class Page:
    """The routes, over one host connection and one adapter connection opened at startup."""

    def __init__(self, config: Config, token: str | None,
                 history_cache_bytes: int = mailboxes.DEFAULT_HISTORY_CACHE_BYTES,
                 max_sessions: int = mailboxes.MAX_SESSIONS) -> None:
        self.config = config
        self.token = token
        self.history_cache_bytes = history_cache_bytes
        self.max_sessions = max_sessions  # the newest sessions the trees list
        self.host: Treemail | None = None
        self.store: EventStore | None = None
        self.histories: mailboxes.HistoryCache | None = None
        self.closing = False

    async def open(self) -> None:
        """Connect (the server unreachable is an error here, before the page is served)."""
        url = self.config.service.redis_url
        self.host = await Treemail.connect(self.config, url)
        self.store = EventStore(await connect(url, self.config.service), self.config.service)
        # The page reads the same sessions again at every live event: only what was appended is read then.
        self.histories = mailboxes.HistoryCache(self.store, self.history_cache_bytes)

    async def close(self) -> None:
        self.closing = True
        if self.host is not None:
            await self.host.close()
            await self.store.redis.aclose()
            self.host = None

    @contextlib.asynccontextmanager
    async def lifespan(self, app):
        if self.host is None:
            await self.open()
        try:
            yield
        finally:
            await self.close()

    # ---- reads --------------------------------------------------------------------------------------------

    async def index(self, request: Request) -> Response:
        return Response(_static("index.html"), media_type=STATIC["index.html"])

    async def session_link(self, request: Request) -> Response:
        """``/s/<session>?at=<position>``: the page, opened on that session at that position (the script reads
        the address). A link that cannot load (a bad position, an unknown session) is answered as such."""
        sid = request.path_params["session_id"]
        if refused := _refused_query(request, ("at",)):
            return refused
        try:
            history = await self.histories.read(sid)
        except UnknownSessionError as error:
            return _error(404, "ui:unknown_session", clip(str(error), MAX_ECHO))
        if (refused := _position_refused(request, history[-1][0] if history else 0)):
            return refused
        return await self.index(request)

    async def message_link(self, request: Request) -> Response:
        """``/m/<message>``: the page, opened on the mailbox the message landed in, with the message shown."""
        if refused := _refused_query(request):
            return refused
        if await self._landed_in(request.path_params["message_id"]) is None:
            return _error(404, "ui:unknown_message", f"no message {limits.shown(request.path_params['message_id'])}")
        return await self.index(request)

    async def message_session(self, request: Request) -> JSONResponse:
        """Where a message landed: what the page needs to open a message link."""
        mid = request.path_params["message_id"]
        if refused := _refused_query(request):
            return refused
        sid = await self._landed_in(mid)
        if sid is None:
            return _error(404, "ui:unknown_message", f"no message {mid}")
        return JSONResponse({"message_id": mid, "session_id": sid})

    async def _landed_in(self, message_id: str) -> str | None:
        """The session a message was sent to: the sender's record says so for mail with a sender; treemail's own
        notices and a host's injected mail have none, so the sessions are searched (read through the cache):
        every one, not only those the trees list, newest first."""
        status = await self.host.obligations.inspect(message_id)
        if "error" not in status:
            return (status.get("receipt") or {}).get("recipient_session_id") or status.get("recipient_session_id")
        for session_id in reversed(await mailboxes.session_ids(self.store, self.config.service.partitions)):
            try:
                history = await self.histories.read(session_id)
            except UnknownSessionError:
                continue  # registered in its partition, its directory entry not (yet) written
            if any(getattr(event, "message_id", None) == message_id and type(event).__name__ ==
                   "ProducerMessageAccepted" for _, event in history):
                return session_id
        return None

    async def static(self, request: Request) -> Response:
        name = request.path_params["name"]
        if name not in STATIC:
            return _error(404, "ui:not_found", f"no file {name}")
        return Response(_static(name), media_type=STATIC[name], headers={"Cache-Control": "no-cache"})

    async def trees(self, request: Request) -> JSONResponse:
        if refused := _refused_query(request):
            return refused
        listing = await mailboxes.sessions(self.store, self.config.service.partitions, self.max_sessions)
        return JSONResponse({
            "trees": mailboxes.trees(listing.rows),
            "obligations": await mailboxes.obligations(self.store, listing.rows),
            # Older sessions the trees leave out, and their open mail with them: the page says how many.
            "not_listed": listing.not_listed, "max_sessions": self.max_sessions,
            "approvals": await self.host.permissions.pending_approvals(), "writable": self.token is not None,
        })

    async def session_timeline(self, request: Request) -> JSONResponse:
        sid = request.path_params["session_id"]
        if refused := _refused_query(request, ("at",)):
            return refused
        try:
            read = self.histories.read
            histories = await mailboxes.with_recipients(
                self.store, sid, await mailboxes.histories_for(self.store, sid, read=read), read=read)
        except UnknownSessionError as error:
            return _error(404, "ui:unknown_session", clip(str(error), MAX_ECHO))
        own = histories.get(sid, ())
        if (refused := _position_refused(request, own[-1][0] if own else 0)):
            return refused
        at = request.query_params.get("at")
        return JSONResponse(tl.timeline(sid, histories, None if at is None else int(at)).to_json())

    async def message_chain(self, request: Request) -> JSONResponse:
        if refused := _refused_query(request):
            return refused
        sid, mid = request.path_params["session_id"], request.path_params["message_id"]
        try:
            histories = await mailboxes.histories_for(self.store, sid, whole_tree=True, read=self.histories.read)
        except UnknownSessionError as error:
            return _error(404, "ui:unknown_session", clip(str(error), MAX_ECHO))
        chain = tl.causal_chain(mid, histories)
        if not chain:
            return _error(404, "ui:unknown_message", f"no message {mid} in the tree of session {sid}")
        return JSONResponse(chain)

    async def events(self, request: Request) -> StreamingResponse | JSONResponse:
        """Every event appended from now on, as server-sent events: the session and the event's type."""
        if refused := _refused_query(request):
            return refused

        async def stream():
            yield ": following the partition feeds\n\n"
            observed = self.host.history.subscribe(types=None, block_ms=1000)
            async for position, session_id, event in observed:
                if self.closing or await request.is_disconnected():
                    return
                data = {"session_id": session_id, "type": type(event).__name__, "feed_position": position}
                yield f"data: {json.dumps(data)}\n\n"

        return StreamingResponse(stream(), media_type="text/event-stream", headers={"Cache-Control": "no-cache"})

    # ---- writes: the operator's token ---------------------------------------------------------------------

    def _refused(self, request: Request) -> JSONResponse | None:
        if refused := _refused_query(request):
            return refused
        if self.token is None:
            return _error(403, "ui:read_only", "this page is read-only: start `treemail ui` with TREEMAIL_UI_TOKEN "
                                               "to allow write actions")
        given = request.headers.get("authorization", "").removeprefix("Bearer ").strip()
        if not hmac.compare_digest(given.encode(), self.token.encode()):
            return _error(401, "ui:unauthorized", "write actions need the operator's token")
        return None

    async def retry(self, request: Request) -> JSONResponse:
        if refused := self._refused(request):
            return refused
        try:
            result = await self.host.obligations.retry(request.path_params["message_id"])
        except TreemailError as error:
            return _coded(error)
        # The host's own code, with the status the gateway gives it (an unknown message is a 404 in both).
        return JSONResponse(result, status_code=status_of(result["error"]) if "error" in result else 200)

    async def decide_approval(self, request: Request) -> JSONResponse:
        if refused := self._refused(request):
            return refused
        request_id, verdict = request.path_params["request_id"], request.path_params["verdict"]
        try:
            if verdict == "approve":
                result = await self.host.permissions.approve(request_id, scope="once")
            elif verdict == "deny":
                result = await self.host.permissions.deny(request_id)
            else:
                return _error(404, "ui:not_found", f"no action {limits.shown(verdict)}: approve or deny")
        except TreemailError as error:
            return _coded(error)
        return JSONResponse(result)


def create_app(config: Config, token: str | None = None, loopback_only: bool = True,
               page: Page | None = None) -> Starlette:
    """The page's app; ``page``: one already connected (``Page.open``), else it connects as it starts."""
    page = page or Page(config, token)
    middleware = [Middleware(TrustedHostMiddleware, allowed_hosts=LOOPBACK_HOSTS)] if loopback_only else []
    return Starlette(
        routes=[
            Route("/", page.index),
            Route("/s/{session_id}", page.session_link),
            Route("/m/{message_id}", page.message_link),
            Route("/static/{name}", page.static),
            Route("/api/trees", page.trees),
            Route("/api/sessions/{session_id}/timeline", page.session_timeline),
            Route("/api/sessions/{session_id}/messages/{message_id}", page.message_chain),
            Route("/api/messages/{message_id}", page.message_session),
            Route("/api/events", page.events),
            Route("/api/messages/{message_id}/retry", page.retry, methods=["POST"]),
            Route("/api/approvals/{request_id}/{verdict}", page.decide_approval, methods=["POST"]),
        ],
        middleware=middleware, lifespan=page.lifespan, exception_handlers={HTTPException: _route_error},
    )

