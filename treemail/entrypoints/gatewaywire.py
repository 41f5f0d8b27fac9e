"""The host gateway's wire: request and response bodies, and how an error's stable code becomes an HTTP status.

Every body is JSON. Requests are strict (an unknown, missing or mistyped field is refused with
``gateway:invalid_request`` before the host API is called), so a client in any language learns of its
mistake at once instead of from a decision made on a guess. Responses carry the host API's own values;
an error is always ``{"error": {"code", "message", "retry_after_ms"?, ...}}`` with the code the Python
host uses, and a status derived from the code alone (``status_of``), so the same refusal has the same
status whichever route answers it.
"""

import dataclasses
import json
import re
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, create_model

from treemail.domain import limits
from treemail.domain.triggers import Interrupt, Wake

# The gateway's own version: the paths' prefix (/v1) and a header on every answer. It moves only when a
# route or a body changes incompatibly; the event protocol's version travels beside it.
GATEWAY_VERSION = 1
PREFIX = f"/v{GATEWAY_VERSION}"
VERSION_HEADER = "Treemail-Gateway-Version"
PROTOCOL_HEADER = "Treemail-Protocol-Version"

INVALID_REQUEST = "gateway:invalid_request"
NOT_FOUND = "gateway:not_found"
UNAVAILABLE = "gateway:unavailable"
INTERNAL = "gateway:internal"
TOO_LARGE = "gateway:request_too_large"

# A long poll holds one server connection for its whole wait: bounded so a client cannot hold the pool.
MAX_BLOCK_MS = 30_000
MAX_COUNT = 100
# Long polls and event streams waiting at once: each holds one of the host's pooled server connections (64
# on one server) for its whole wait, so together at most half of them, and the other operations always
# find one free. One past the bound is refused for a moment (429), and its runner comes back.
MAX_WAITING_READS = 32
POLL_RETRY_AFTER_MS = 1000
TOO_MANY_POLLS = "gateway:too_many_polls"
TOO_MANY_STREAMS = "gateway:too_many_streams"
# An event stream with nothing to say writes a comment this often, so a proxy between it and its client
# (most close a connection idle for 60 s) keeps it open, and the client can tell a dead connection.
HEARTBEAT_MS = 15_000
# How long an EventSource waits before it reconnects (the stream's "retry:" field).
RECONNECT_MS = 1000
# The triggers one stream remembers having sent, so one its runner holds unacknowledged is not sent again.
SENT_REMEMBERED = 10_000
# A request body is read whole before it is parsed: bounded well above any body treemail stores (a
# message's images included), so a runaway client cannot fill the gateway's memory.
MAX_REQUEST_BYTES = 16 * 1024 * 1024


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


# ---- requests ----------------------------------------------------------------------------------------------

Status = Literal["queued", "running", "idle", "finished"]
StopReason = Literal["completed", "aborted", "max_tokens", "refusal", "error"]
Mode = Literal["steer", "queue"]
# The agent document's rules as the host API takes them: a bare effect (for "*"), pattern -> effect (or per
# action: {"message": ..., "interrupt": ...}), or [pattern, effect] pairs in declaration order.
RulesIn = str | dict[str, Any] | list[list[str]] | None


class RegisterRoot(Strict):
    agent_type: str
    description: str = ""
    rules: RulesIn = None
    send_message_tool: bool = True
    status: Status = "running"
    with_handle: bool = True
    accepts_images: bool = False


class RegisterChild(Strict):
    agent_type: str
    description: str = ""
    rules: RulesIn = None
    send_message_tool: bool = True
    status: Status = "queued"
    with_handle: bool = True
    resident: bool = True
    continuable: bool = True
    accepts_images: bool = False


class SetStatus(Strict):
    status: Status


class StartRun(Strict):
    run_id: str


class FinishRun(Strict):
    reason: StopReason | None = None
    closing_text: str | None = None


# A JSON number an engine in JavaScript holds exactly: a step or a token count past it would come back changed.
MAX_SAFE_INTEGER = 2 ** 53 - 1


class Claim(Strict):
    step: int | None = Field(default=None, ge=0, le=MAX_SAFE_INTEGER)


class Consume(Strict):
    step: int | None = Field(default=None, ge=0, le=MAX_SAFE_INTEGER)
    tokens: int | None = Field(default=None, ge=0, le=MAX_SAFE_INTEGER)


class Reason(Strict):
    reason: str = ""


class Inject(Strict):
    owner: Literal["plugin", "delegation", "goal"]
    body: str
    mode: Mode = "queue"


class HostSend(Strict):
    to: str
    body: str
    mode: Mode = "steer"
    idempotency_key: str | None = None
    run_id: str | None = None
    urgent: bool = False


class Context(Strict):
    """Who calls: the host's execution context, never the model's arguments."""

    session_id: str
    run_id: str
    tool_call_id: str


class ToolCall(Strict):
    context: Context
    # The model's arguments, as the model wrote them: the tool checks them and refuses with its own code.
    arguments: Any = None


def _token_of(trigger: type, name: str) -> type[Strict]:
    """The wire body of a trigger the host reads from a wake stream, made of the trigger's own fields: a
    runner hands back exactly the token it was given, so the wire and the host's trigger cannot drift."""
    fields: dict[str, Any] = {field.name: (field.type, ...) for field in dataclasses.fields(trigger)}
    return create_model(name, __base__=Strict, __module__=__name__, **fields)


WakeToken = _token_of(Wake, "WakeToken")


class RunWake(Strict):
    wake: WakeToken
    run_id: str


InterruptToken = _token_of(Interrupt, "InterruptToken")


class AbortRun(Strict):
    interrupt: InterruptToken


class Caller(Strict):
    caller_session_id: str | None = None


class RegisterRoute(Strict):
    name: str
    target_session_id: str
    source_session_id: str | None = None
    source_agent_type: str | None = None
    description: str | None = None
    input_schema: dict[str, Any] | None = None


class RevokeRoute(Strict):
    name: str
    source_session_id: str | None = None
    source_agent_type: str | None = None


class SetGrant(Strict):
    target_session_id: str
    source_session_id: str | None = None
    source_agent_type: str | None = None
    principal: str | None = None
    context: bool = False
    read: bool = False
    send: bool = False
    control: bool = False


class Dispose(Strict):
    reason: StopReason | None = None
    closing_text: str | None = None


class StopSubtree(Strict):
    how: Literal["dispose", "interrupt"] = "dispose"
    reason: StopReason | None = "aborted"
    closing_text: str | None = None
    idempotency_key: str | None = None


class InstallTools(Strict):
    names: list[str]


class Empty(Strict):
    pass


class Approve(Strict):
    scope: Literal["once", "tree"] = "once"


class Drain(Strict):
    # None: the whole service; else this session and every session below it.
    session_id: str | None = None


class Reconcile(Strict):
    # The host restarted: runs still open in the streams are finished (their claims released).
    interrupted_runs: bool = False


class MessageRules(Strict):
    # None removes the overlay.
    rules: RulesIn


# ---- responses -----------------------------------------------------------------------------------------------


class Info(BaseModel):
    gateway_version: int
    protocol_version: int
    treemail_version: str


class Registration(BaseModel):
    session_id: str
    handle: str | None
    root_session_id: str


class Ok(BaseModel):
    ok: Literal[True] = True


class Gate(BaseModel):
    # The settlement notice's gate, or null for a finish without a stop reason.
    gate: str | None


class Delivery(BaseModel):
    message_id: str
    owner: str
    mode: str
    sender_session_id: str | None
    text: str
    parts: list[dict[str, Any]]
    principal: str | None
    verified: bool


class Deliveries(BaseModel):
    deliveries: list[Delivery]


class MessageId(BaseModel):
    message_id: str


class Wakes(BaseModel):
    wakes: list[WakeToken]


class Started(BaseModel):
    started: bool


class Interrupts(BaseModel):
    interrupts: list[InterruptToken]


class Aborted(BaseModel):
    aborted: bool


class Revoked(BaseModel):
    revoked: bool


class Principal(BaseModel):
    principal: str


class Route(BaseModel):
    name: str
    target_session_id: str
    principal: str | None
    context: bool
    read: bool
    send: bool
    control: bool


class Routes(BaseModel):
    routes: list[Route]


class Definitions(BaseModel):
    tools: list[dict[str, Any]]


class Installed(BaseModel):
    installed: list[str]


class Disposed(BaseModel):
    returned: dict[str, str]
    settlement: str | None


class Stopped(BaseModel):
    stopped: list[dict[str, Any]]


class Approvals(BaseModel):
    approvals: list[dict[str, Any]]


class Draining(BaseModel):
    # Sessions draining (or no longer) because of this call; 0 for the whole service.
    sessions: int


class Reconciled(BaseModel):
    woken: int


class Guidance(BaseModel):
    guidance: str | None


class ErrorDetail(BaseModel):
    model_config = ConfigDict(extra="allow")  # occupancy and whatever else a refusal explains itself with

    code: str
    message: str
    retry_after_ms: int | None = None


class Error(BaseModel):
    error: ErrorDetail


class ToolAnswer(BaseModel):
    """A model-facing call: the tool's result, the one line the model reads, and whether it is an error.
    A refusal answers with its error's status and also carries ``error`` (the result's) at the top."""

    result: dict[str, Any]
    text: str
    is_error: bool
    error: ErrorDetail | None = None


class Result(BaseModel):
    """An answer the host API gives as a dict (a message's status, a send's result): as it is."""

    model_config = ConfigDict(extra="allow")


# ---- statuses ----------------------------------------------------------------------------------------------

# The last part of a code (``send_message:inbox_full`` -> ``inbox_full``) decides, in this order; a code
# no rule names is a conflict with the state the request found.
_UNAVAILABLE = {"engine_shutdown", "draining", "unavailable", "not_replicated", "contention"}
_FORBIDDEN = {"permission_denied", "not_granted", "disabled", "not_tree_peer", "self_send", "plugin_refused",
              "not_direct_neighbour", "not_resident_child", "self_interrupt"}


def status_of(error: dict) -> int:
    """The HTTP status of an error body's ``error`` (its code, and whether it says when to retry)."""
    code = error.get("code", "")
    last = code.rsplit(":", 1)[-1]
    if error.get("retry_after_ms") is not None:
        return 429  # it may pass later, and says when
    if code == INTERNAL:
        return 500
    if code == TOO_LARGE:
        return 413
    if last in _UNAVAILABLE:
        return 503
    if last.startswith("unknown") or last == "not_found":
        return 404
    if last.startswith("invalid") or last == "too_long" or last == "input_mismatch":
        return 400
    if last in _FORBIDDEN:
        return 403
    return 409


# ---- event streams ---------------------------------------------------------------------------------------

_POSITION = re.compile(r"^(\d{1,5}):(\d+-\d+)$", re.ASCII)
def position_text(position: dict[int, str]) -> str:
    """A stream's position, its events' ``id``: per partition, the last wake stream entry sent ("0:1712-0,3:1715-2")."""
    return ",".join(f"{partition}:{entry_id}" for partition, entry_id in sorted(position.items()))


def parse_position(text: str, partitions: int) -> dict[int, str]:
    """The position a reconnecting client names in ``Last-Event-ID``; ValueError when it is not one of ours."""
    position: dict[int, str] = {}
    for part in filter(None, text.strip().split(",")):
        found = _POSITION.match(part)
        if found is None or int(found[1]) >= partitions or not limits.is_entry_id(found[2]):
            raise ValueError(f"Last-Event-ID is not a position this gateway wrote ({partitions} partitions): "
                             f"{text[:200]!r}")
        position[int(found[1])] = found[2]
    return position


def _later(entry_id: str, than: str | None) -> bool:
    """Whether a stream entry id comes after another (ids are "<ms>-<seq>", compared as numbers)."""
    return than is None or tuple(map(int, entry_id.split("-"))) > tuple(map(int, than.split("-")))


class Sent:
    """What one event stream has sent: its position, and the triggers it remembers sending.

    A trigger read and not acknowledged within reclaim_idle_ms is claimed again by the next read, as a dead
    runner's is; the runner of this stream is alive and has it, so the stream does not send it twice."""

    def __init__(self, position: dict[int, str]) -> None:
        self.position = dict(position)
        self._sent: dict[tuple[int, str], None] = {}

    def add(self, partition: int, entry_id: str) -> str | None:
        """The id of the event that sends this trigger (the position after it), or None: sent already."""
        if (partition, entry_id) in self._sent:
            return None
        self._sent[(partition, entry_id)] = None
        if len(self._sent) > SENT_REMEMBERED:
            del self._sent[next(iter(self._sent))]
        if _later(entry_id, self.position.get(partition)):
            self.position[partition] = entry_id
        return position_text(self.position)


def sse_event(event: str, event_id: str, data: dict) -> str:
    return f"id: {event_id}\nevent: {event}\ndata: {json.dumps(data, separators=(',', ':'))}\n\n"


def error_body(code: str, message: str) -> dict:
    return {"error": {"code": code, "message": message}}
