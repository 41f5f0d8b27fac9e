"""What the host API hands back: a registration, a claimed delivery, a tool result for a model."""

from dataclasses import dataclass


@dataclass(frozen=True)
class Registration:
    session_id: str
    # None for a session registered without a handle: it is addressed by its UUID.
    handle: str | None
    root_session_id: str


@dataclass(frozen=True)
class Delivery:
    """One claimed message, rendered for the recipient's prompt."""

    message_id: str
    owner: str
    mode: str
    sender_session_id: str | None
    text: str
    # The message as the host's content parts, in order: the rendered text, then its images (content blocks).
    parts: tuple[dict, ...] = ()
    # Mail over a peer route: its principal; verified: its source proof held (proofs on).
    principal: str | None = None
    verified: bool = False
    # Earlier claims that handed it to a model and were never confirmed (a dropped connection, a lost run).
    shown_before: int = 0


@dataclass(frozen=True)
class ToolResult:
    """A send_message result as a model-facing tool result: the structured result and the text a model reads."""

    result: dict
    text: str
    is_error: bool
