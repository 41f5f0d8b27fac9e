"""What a host runner reads from the wake streams: a wake (start a run) or an interrupt (stop one)."""

from dataclasses import dataclass


@dataclass(frozen=True)
class Wake:
    """A wake trigger: start a run on this session with its due mail as input, then ack."""

    session_id: str
    message_id: str | None
    stream: str
    entry_id: str


@dataclass(frozen=True)
class Interrupt:
    """Stop ``run_id`` of this session at its next safe point, then finish it aborted and ack."""

    session_id: str
    run_id: str
    interrupt_id: str
    sender_session_id: str
    reason: str
    stream: str
    entry_id: str
