"""The host gateway's operations: one row per route, each one call into the host API (``Treemail``).

Every decision stays where it is made for a Python host: the gateway parses the strict body
(``gatewaywire``), calls the host API with it and hands back what the host API answered. It keeps and
stores nothing, so idempotency by tool call id, the exact live sender and the etag of each step are the
host API's own, over the wire as in process. The rows are data: the app is built from them and so is the
OpenAPI document (``gatewayapi``), so a route cannot be served undocumented or documented unserved.
"""

import dataclasses
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from pydantic import BaseModel

from treemail.domain import limits
from treemail.domain.commands import SendContext
from treemail.domain.protocol import PROTOCOL_VERSION
from treemail.host import Interrupt, Treemail, Wake, __version__

from . import gatewaywire as w


@dataclasses.dataclass(frozen=True)
class Call:
    """What one request hands its operation: the host API, the path's values, the parsed body and query."""

    host: Treemail
    path: dict[str, str]
    body: Any
    query: dict[str, Any]
    # The wake streams a wake or interrupt token may name: the gateway acknowledges nothing else.
    wake_streams: frozenset[str]
    # An event stream's resumption: wake stream -> the last entry its client received (Last-Event-ID).
    after: dict[str, str] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True)
class Query:
    name: str
    kind: type  # str or int
    required: bool = False
    default: Any = None
    minimum: int | None = None
    maximum: int | None = None
    description: str = ""


@dataclasses.dataclass(frozen=True)
class Operation:
    id: str
    method: str
    path: str
    summary: str
    run: Callable[[Call], Awaitable[Any] | AsyncIterator[Any]]
    request: type[BaseModel] | None = None
    response: type[BaseModel] = w.Ok
    query: tuple[Query, ...] = ()
    # The error statuses this route may answer beside 400 (its input) and 503 (the server unreachable).
    errors: tuple[int, ...] = (404, 409)
    # Waits for something to happen (up to block_ms): abandoned when its client goes away.
    long_poll: bool = False
    # An event stream (text/event-stream) of these events: ``run`` yields triggers, and None when it has
    # waited a heartbeat's time for one.
    events: str | None = None


def _context(body: w.ToolCall) -> SendContext:
    c = body.context
    return SendContext(c.session_id, c.run_id, c.tool_call_id)


def tool_answer(host: Treemail, name: str, result: dict) -> dict:
    answer = {"result": result, "text": host.tools.result_text(name, result), "is_error": "error" in result}
    return {**answer, "error": result["error"]} if "error" in result else answer


def _handed_out(token, streams: frozenset[str]) -> None:
    """A trigger's token names a wake stream and an entry of it as the gateway handed it out: checked before
    the run it starts or ends is touched, whose acknowledgement would otherwise fail after it."""
    if token.stream not in streams:
        raise ValueError(f"stream {limits.shown(token.stream)} is not a wake stream: give back the token the "
                         "gateway handed out")
    if not limits.is_entry_id(token.entry_id):
        raise ValueError(f"entry_id {limits.shown(token.entry_id)} is not a stream entry id: give back the token "
                         "the gateway handed out")


def _wake(token: w.WakeToken, streams: frozenset[str]) -> Wake:
    _handed_out(token, streams)
    return Wake(token.session_id, token.message_id, token.stream, token.entry_id)


def _interrupt(token: w.InterruptToken, streams: frozenset[str]) -> Interrupt:
    _handed_out(token, streams)
    return Interrupt(**token.model_dump())


# ---- the operations, in the order an engine meets them -------------------------------------------------------

async def info(call: Call) -> dict:
    return {"gateway_version": w.GATEWAY_VERSION, "protocol_version": PROTOCOL_VERSION, "treemail_version": __version__}


async def register_root(call: Call) -> dict:
    return dataclasses.asdict(await call.host.register_root(**call.body.model_dump()))


async def register_child(call: Call) -> dict:
    return dataclasses.asdict(await call.host.register_child(call.path["session_id"], **call.body.model_dump()))


async def set_status(call: Call) -> dict:
    await call.host.set_status(call.path["session_id"], call.body.status)
    return {"ok": True}


async def tools(call: Call) -> dict:
    session_id, format = call.path["session_id"], call.query["format"]
    if format == "treemail":
        return {"tools": await call.host.tools.definitions(session_id)}
    if format not in ("anthropic", "openai", "mcp"):
        raise ValueError(f"format must be treemail, anthropic, openai or mcp, got {format!r}")
    return {"tools": await call.host.tools.schemas(session_id, format)}


async def install_tools(call: Call) -> dict:
    return {"installed": await call.host.tools.install(call.path["session_id"], call.body.names)}


async def start_run(call: Call) -> dict:
    await call.host.start_run(call.path["session_id"], call.body.run_id)
    return {"ok": True}


async def finish_run(call: Call) -> dict:
    gate = await call.host.finish_run(call.path["session_id"], call.path["run_id"], call.body.reason,
                                      call.body.closing_text)
    return {"gate": gate}


async def claim(call: Call) -> dict:
    claimed = await call.host.claim(call.path["session_id"], call.path["run_id"], call.body.step)
    return {"deliveries": [{**dataclasses.asdict(d), "parts": list(d.parts)} for d in claimed]}


async def consume(call: Call) -> dict:
    await call.host.consume(call.path["session_id"], call.path["message_id"], step=call.body.step,
                            tokens=call.body.tokens)
    return {"ok": True}


async def release(call: Call) -> dict:
    await call.host.release(call.path["session_id"], call.path["message_id"], reason=call.body.reason)
    return {"ok": True}


async def discard(call: Call) -> dict:
    await call.host.discard(call.path["session_id"], call.path["message_id"], call.body.reason)
    return {"ok": True}


async def inject(call: Call) -> dict:
    body = call.body
    return {"message_id": await call.host.inject(call.path["session_id"], body.owner, body.body, body.mode)}


async def host_send(call: Call) -> dict:
    return await call.host.send(call.path["session_id"], **call.body.model_dump())


async def send_message(call: Call) -> dict:
    return tool_answer(call.host, "send_message", await call.host.send_message(_context(call.body),
                                                                               call.body.arguments))


async def call_tool(call: Call) -> dict:
    name = call.path["name"]
    return tool_answer(call.host, name, await call.host.tools.call(_context(call.body), name, call.body.arguments))


async def wakes(call: Call) -> dict:
    q = call.query
    return {"wakes": [dataclasses.asdict(wake) for wake in await call.host.wakes(q["consumer"], q["count"],
                                                                                  q["block_ms"])]}


async def follow_wakes(call: Call) -> AsyncIterator[Wake | None]:
    """Those read for this runner that its last connection never received, then every new one as it comes."""
    q = call.query
    for wake in await call.host.obligations.unacknowledged_wakes(q["consumer"], call.after):
        yield wake
    while True:
        batch = await call.host.wakes(q["consumer"], q["count"], q["heartbeat_ms"])
        if not batch:
            yield None
        for wake in batch:
            yield wake


async def run_wake(call: Call) -> dict:
    return {"started": await call.host.wake_run(_wake(call.body.wake, call.wake_streams), call.body.run_id)}


async def interrupts(call: Call) -> dict:
    q = call.query
    read = await call.host.interrupts.read(q["consumer"], q["count"], q["block_ms"])
    return {"interrupts": [dataclasses.asdict(it) for it in read]}


async def follow_interrupts(call: Call) -> AsyncIterator[Interrupt | None]:
    q = call.query
    for it in await call.host.interrupts.unacknowledged(q["consumer"], call.after):
        yield it
    while True:
        batch = await call.host.interrupts.read(q["consumer"], q["count"], q["heartbeat_ms"])
        if not batch:
            yield None
        for it in batch:
            yield it


async def abort_run(call: Call) -> dict:
    return {"aborted": await call.host.interrupts.abort_run(_interrupt(call.body.interrupt, call.wake_streams))}


async def inspect(call: Call) -> dict:
    return await call.host.obligations.inspect(call.path["message_id"], call.query["caller_session_id"])


async def retry(call: Call) -> dict:
    return await call.host.obligations.retry(call.path["message_id"], call.body.caller_session_id)


async def cancel(call: Call) -> dict:
    return await call.host.obligations.cancel(call.path["message_id"], call.body.caller_session_id)


async def register_route(call: Call) -> dict:
    body = call.body.model_dump()
    await call.host.peers.register_route(body.pop("name"), body.pop("target_session_id"), **body)
    return {"ok": True}


async def revoke_route(call: Call) -> dict:
    body = call.body.model_dump()
    return {"revoked": await call.host.peers.revoke_route(body.pop("name"), **body)}


async def set_grant(call: Call) -> dict:
    body = call.body.model_dump()
    return {"principal": await call.host.peers.set_grant(body.pop("target_session_id"), **body)}


async def routes(call: Call) -> dict:
    return {"routes": await call.host.peers.routes(call.path["session_id"])}


async def dispose(call: Call) -> dict:
    return dataclasses.asdict(await call.host.disposal.dispose(call.path["session_id"], call.body.reason,
                                                               call.body.closing_text))


async def stop_subtree(call: Call) -> dict:
    body = call.body.model_dump()
    return {"stopped": await call.host.disposal.stop_subtree(call.path["session_id"], body.pop("how"), **body)}


async def pending_approvals(call: Call) -> dict:
    return {"approvals": await call.host.permissions.pending_approvals()}


async def approve(call: Call) -> dict:
    return await call.host.permissions.approve(call.path["request_id"], scope=call.body.scope)


async def deny(call: Call) -> dict:
    return await call.host.permissions.deny(call.path["request_id"])


async def set_message_rules(call: Call) -> dict:
    await call.host.permissions.set_message_rules(call.path["session_id"], call.body.rules)
    return {"ok": True}


async def effective(call: Call) -> dict:
    return await call.host.permissions.effective(call.path["session_id"])


async def return_guidance(call: Call) -> dict:
    return {"guidance": await call.host.permissions.return_guidance(call.path["session_id"])}


async def drain(call: Call) -> dict:
    return {"sessions": await call.host.disposal.drain(call.body.session_id)}


async def undrain(call: Call) -> dict:
    return {"sessions": await call.host.disposal.undrain(call.body.session_id)}


async def reconcile(call: Call) -> dict:
    return {"woken": await call.host.obligations.reconcile(interrupted_runs=call.body.interrupted_runs)}


CONSUMER = Query("consumer", str, required=True, description="this runner's name in the runners' consumer group")
COUNT = Query("count", int, default=10, minimum=1, maximum=w.MAX_COUNT, description="at most this many")
# At least 1: a block of 0 is "wait forever" to the server, which no poll through the gateway may do.
BLOCK = Query("block_ms", int, default=1000, minimum=1, maximum=w.MAX_BLOCK_MS,
              description="how long to wait for one when none is there (a long poll)")
HEARTBEAT = Query("heartbeat_ms", int, default=w.HEARTBEAT_MS, minimum=1, maximum=w.MAX_BLOCK_MS,
                  description="with nothing to send for this long, a comment line (a heartbeat)")
S = "/sessions/{session_id}"

OPERATIONS: tuple[Operation, ...] = (
    Operation("info", "GET", "", "The gateway's version and the event protocol's", info, response=w.Info, errors=()),
    Operation("registerRoot", "POST", "/sessions", "Register a root session", register_root, w.RegisterRoot,
              w.Registration, errors=()),
    Operation("registerChild", "POST", f"{S}/children", "Register a child of this session", register_child,
              w.RegisterChild, w.Registration),
    Operation("setStatus", "PUT", f"{S}/status", "Move the session to queued, running, idle or finished",
              set_status, w.SetStatus),
    Operation("tools", "GET", f"{S}/tools", "The model-facing tools this session may see", tools,
              response=w.Definitions, errors=(404,),
              query=(Query("format", str, default="treemail",
                           description="treemail (the canonical definitions), anthropic, openai or mcp"),)),
    Operation("installTools", "PUT", f"{S}/tools", "Offer exactly these optional tools to the session's model",
              install_tools, w.InstallTools, w.Installed),
    Operation("startRun", "POST", f"{S}/runs", "Open a run: only a session's open run may send", start_run,
              w.StartRun),
    Operation("finishRun", "POST", f"{S}/runs/{{run_id}}/finish", "The run ended; with a stop reason the parent "
              "is told", finish_run, w.FinishRun, w.Gate),
    Operation("claim", "POST", f"{S}/runs/{{run_id}}/claim", "At a safe model-request boundary: the mail due "
              "in this run, claimed", claim, w.Claim, w.Deliveries),
    Operation("consume", "POST", f"{S}/mail/{{message_id}}/consume", "The model request carrying this message "
              "succeeded", consume, w.Consume),
    Operation("release", "POST", f"{S}/mail/{{message_id}}/release", "The model request failed: due again "
              "after a backoff", release, w.Reason),
    Operation("discard", "POST", f"{S}/mail/{{message_id}}/discard", "Set the message aside for good", discard,
              w.Reason),
    Operation("inject", "POST", f"{S}/inject", "Plugin, delegation or goal mail", inject, w.Inject, w.MessageId),
    Operation("send", "POST", f"{S}/send", "A programmatic send by the host, under its own idempotency key",
              host_send, w.HostSend, w.Result, errors=(403, 404, 409, 429)),
    Operation("sendMessage", "POST", "/send_message", "A model's send_message call", send_message, w.ToolCall,
              w.ToolAnswer, errors=(403, 404, 409, 429)),
    Operation("callTool", "POST", "/tools/{name}", "A model's call of any other installed tool (interrupt_agent, "
              "send_to_peer, ...)", call_tool, w.ToolCall, w.ToolAnswer, errors=(403, 404, 409, 429)),
    Operation("pollWakes", "GET", "/wakes", "Wake triggers for this runner (a long poll)", wakes,
              response=w.Wakes, query=(CONSUMER, COUNT, BLOCK), errors=(429,), long_poll=True),
    Operation("wakes", "GET", "/wakes/stream", "Wake triggers for this runner as they come (server-sent events, "
              "resumed after Last-Event-ID)", follow_wakes, response=w.WakeToken, query=(CONSUMER, COUNT, HEARTBEAT),
              errors=(429,), events="wake"),
    Operation("wakeRun", "POST", "/wakes/run", "Start the woken run and acknowledge its trigger", run_wake,
              w.RunWake, w.Started),
    Operation("pollInterrupts", "GET", "/interrupts", "Interrupt triggers of runs still open (a long poll)",
              interrupts, response=w.Interrupts, query=(CONSUMER, COUNT, BLOCK), errors=(429,), long_poll=True),
    Operation("interrupts", "GET", "/interrupts/stream", "Interrupt triggers of runs still open as they come "
              "(server-sent events, resumed after Last-Event-ID)", follow_interrupts, response=w.InterruptToken,
              query=(CONSUMER, COUNT, HEARTBEAT), errors=(429,), events="interrupt"),
    Operation("abortRun", "POST", "/interrupts/abort", "Finish the interrupted run aborted and acknowledge",
              abort_run, w.AbortRun, w.Aborted),
    Operation("inspect", "GET", "/messages/{message_id}", "What became of a sent message", inspect,
              response=w.Result, errors=(403, 404),
              query=(Query("caller_session_id", str, description="the session asking; none: the host"),)),
    Operation("retry", "POST", "/messages/{message_id}/retry", "Renew a parked message's budget", retry, w.Caller,
              w.Result, errors=(403, 404, 409)),
    Operation("cancel", "POST", "/messages/{message_id}/cancel", "Take back a message no claim took yet", cancel,
              w.Caller, w.Result, errors=(403, 404, 409)),
    Operation("registerRoute", "POST", "/peers/routes", "A peer route from a source to a target of any tree",
              register_route, w.RegisterRoute),
    Operation("revokeRoute", "POST", "/peers/routes/revoke", "Revoke a peer route", revoke_route, w.RevokeRoute,
              w.Revoked),
    Operation("setGrant", "PUT", "/peers/grants", "Replace what a source may do to a target", set_grant, w.SetGrant,
              w.Principal),
    Operation("routes", "GET", f"{S}/peers", "The session's peer names, with what each grant allows", routes,
              response=w.Routes, errors=(404,)),
    Operation("pendingApprovals", "GET", "/approvals", "Sends waiting for a person (an ask rule)", pending_approvals,
              response=w.Approvals, errors=()),
    Operation("approve", "POST", "/approvals/{request_id}/approve", "Let a waiting send through, once or for the "
              "tree", approve, w.Approve, w.Result),
    Operation("deny", "POST", "/approvals/{request_id}/deny", "Refuse a waiting send", deny, w.Empty, w.Result),
    Operation("setMessageRules", "PUT", f"{S}/message_rules", "Lay the host's overlay of message rules (null "
              "removes it)", set_message_rules, w.MessageRules),
    Operation("permissions", "GET", f"{S}/permissions", "The effective permissions: visibility, and per label its "
              "effect and deciding rule", effective, response=w.Result, errors=(404,)),
    Operation("returnGuidance", "GET", f"{S}/return_guidance", "The sentence for a child's first prompt, or null",
              return_guidance, response=w.Guidance, errors=(404,)),
    Operation("drain", "POST", "/drain", "Refuse new sends from or to the service, or a session and its subtree",
              drain, w.Drain, w.Draining),
    Operation("undrain", "POST", "/undrain", "Lift a drain", undrain, w.Drain, w.Draining),
    Operation("reconcile", "POST", "/reconcile", "After a restart: re-derive every wake and obligation from the "
              "streams", reconcile, w.Reconcile, w.Reconciled, errors=()),
    Operation("dispose", "POST", f"{S}/dispose", "Dispose of the session: pending mail goes back to its senders",
              dispose, w.Dispose, w.Disposed),
    Operation("stopSubtree", "POST", f"{S}/stop_subtree", "Dispose or interrupt the session and all below it, "
              "bottom-up", stop_subtree, w.StopSubtree, w.Stopped),
)
