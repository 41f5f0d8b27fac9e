"""Commands: what a caller asks for, in the imperative. Plain data, no behaviour."""

from dataclasses import dataclass
from typing import Literal


@dataclass(frozen=True)
class SendContext:
    """Who is sending: always from the host's execution context, never from model arguments."""

    session_id: str
    run_id: str
    tool_call_id: str


@dataclass(frozen=True)
class SendArguments:
    """The model's arguments after strict validation."""

    to: str
    body: str
    mode: Literal["steer", "queue"] = "steer"


@dataclass(frozen=True)
class SendMessage:
    command_id: str
    context: SendContext
    arguments: SendArguments
    reply_to: str
