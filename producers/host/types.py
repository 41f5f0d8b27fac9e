"""What the host API hands back: a registration, a claimed delivery, a tool result for a model."""

from dataclasses import dataclass

from treemail.domain.notices import NOTICE_KINDS


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

    # What the history knows of it, so the host can log and trace a step with the mail it took: its number in
    # its directed pair (None: not agent mail), the message its sender's run had last consumed (None: it
    # caused itself), its causal chain (its own id when it starts one), and the W3C trace it travels in
    # (``traceparent``; ``trace_id`` its trace's id; None when tracing was off where it was sent).
    sequence: int | None = None
    caused_by: str | None = None
    chain_id: str | None = None
    traceparent: str | None = None
    trace_id: str | None = None

    @property
    def source_kind(self) -> str:
        """What the text is: ``agent_message`` (words an agent chose to send), or the kind of a notice that
        is treemail's own (``subagent_settled``, ``message_returned``, ``loop_stopped``), which a transcript
        must never credit to ``sender_session_id`` (for a settlement, the child it reports on)."""
        return NOTICE_KINDS.get(self.owner, "agent_message" if self.owner == "agent" else self.owner)


@dataclass(frozen=True)
class ToolResult:
    """A send_message result as a model-facing tool result: the structured result and the text a model reads."""

    result: dict
    text: str
    is_error: bool
