"""The payloads on the command, reply and wake channels, as pydantic models: for documentation only.

The hot paths never build these: a command is encoded and parsed by hand in
``codec.py``, a reply is a dict the worker dumps, a wake trigger is written by
``eventstore.wake_trigger``. These models describe exactly those bytes for
the AsyncAPI document (``consumers/asyncapi.py``), and tests validate what
the real code writes against them (``extra="forbid"``), so the document
cannot describe a payload the code does not send.
"""

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, RootModel

from ..domain.errors import Code

_closed = ConfigDict(extra="forbid")

SessionId = Annotated[str, Field(description="a session id (UUIDv7)")]


class CommandPayload(BaseModel):
    """A SendMessage command: the JSON in the stream entry's one field, `__data__`."""

    model_config = ConfigDict(extra="forbid", title="SendMessageCommand")

    v: int = Field(description="the protocol version that wrote the command; a worker refuses a newer one")
    id: str = Field(description="the command id; its reply carries it as `command_id`")
    ctx: tuple[
        Annotated[str, Field(description="sender session id, from the host's context")],
        Annotated[str, Field(description="run id")],
        Annotated[str, Field(description="tool call id")],
    ] = Field(description="who sends: [session, run, tool call], never from the model; the idempotency key")
    args: tuple[
        Annotated[str, Field(description="to: a handle or session id")],
        Annotated[str, Field(description="body")],
        Annotated[Literal["steer", "queue"], Field(description="mode")],
    ] = Field(description="the model's arguments after strict validation: [to, body, mode]")
    reply_to: str = Field(description="the producer's client id: the decision goes to the list `tm:reply:<reply_to>`")
    tp: str | None = Field(default=None, description="W3C traceparent of the send's preparation, when tracing is on")
    u: bool | None = Field(default=None, description="true: an urgent send (absent for a normal one)")
    n: bool | None = Field(default=None, description="true: the host asked for `sequence` in the result "
                                                      "(absent: only a sender with the read receipt tool gets it)")


class SendResult(BaseModel):
    model_config = _closed

    message_id: str
    mode: Literal["steer", "queue"]
    recipient_state: Literal["running", "queued", "waking_finished"]
    sequence: int | None = Field(default=None, description="the message's number in its directed pair: only for a "
                                                           "sender with the read receipt tool, or a host that asked")


class ErrorDetail(BaseModel):
    model_config = _closed

    code: Code = Field(description="a stable error code")
    message: str = Field(description="for the model: what went wrong and what to do")


class ApprovalDetail(BaseModel):
    model_config = _closed

    request_id: str = Field(description="the approval request a person answers (`treemail approvals`)")
    label: str = Field(description="the relationship the `ask` rule matched")


class AcceptedReply(BaseModel):
    """The send was accepted: its events are durable in the recipient's stream."""

    model_config = _closed

    command_id: str
    ok: SendResult


class RefusedReply(BaseModel):
    model_config = _closed

    command_id: str
    error: ErrorDetail


class AwaitingApprovalReply(BaseModel):
    """An `ask` rule: the producer waits for a person, then sends the same tool call again."""

    model_config = _closed

    command_id: str
    approval: ApprovalDetail


class Reply(RootModel[AcceptedReply | RefusedReply | AwaitingApprovalReply]):
    """One decision, pushed as JSON onto the producer's reply list."""

    model_config = ConfigDict(title="SendDecision")


class WakeTrigger(BaseModel):
    """The JSON in a wake entry's `data` field (its `session` field repeats the session id)."""

    model_config = ConfigDict(extra="forbid", title="WakeTrigger")

    session_id: SessionId = Field(description="the session to start a run on, with its due mail as input")
    root_session_id: SessionId
    message_id: str | None = Field(description="the message that asked for the wake; null for a reconcile")
    seq: int = Field(description="position of the SessionWakeRequested event in the session's stream")
