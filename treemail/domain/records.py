"""The directory record of a session: its origin, written once at registration and never changed."""

import json
from dataclasses import dataclass, field

from . import permissions


@dataclass(frozen=True)
class SessionRecord:
    session_id: str
    root_session_id: str
    parent_session_id: str | None
    agent_type: str
    description: str
    # None for a session registered without a handle (pre-handle): its UUID is its only address.
    handle: str | None
    rules: list[tuple[str, str]]
    send_message_tool: bool
    partition: int
    # Direct routing, content blocks, interrupt_agent. Defaults keep records written before these
    # fields existed readable.
    resident: bool = True  # the host keeps this session able to take mail mid-run (routing = "direct")
    continuable: bool = True  # it can be continued with new turns after its first
    accepts_images: bool = False  # its model reads image blocks
    interrupt_rules: list[tuple[str, str]] = field(default_factory=list)  # the `interrupt` action's rules

    @property
    def address(self) -> str:
        """What a peer writes in `to` (and reads in an envelope): the handle, or the UUID without one."""
        return self.handle or self.session_id

    @property
    def origin(self) -> permissions.Origin:
        return permissions.Origin(self.session_id, self.parent_session_id)

    def to_json(self) -> str:
        return json.dumps(self.__dict__, separators=(",", ":"))

    @classmethod
    def from_json(cls, text: str | bytes) -> "SessionRecord":
        data = json.loads(text)
        data["rules"] = [tuple(rule) for rule in data["rules"]]
        data["interrupt_rules"] = [tuple(rule) for rule in data.get("interrupt_rules", ())]
        return cls(**data)


@dataclass(frozen=True)
class Peer:
    """A tree member as the self-repairing candidate list shows it."""

    record: SessionRecord
    status: str

    def line(self) -> str:
        """A pre-handle peer's row: its UUID is its address, printed once."""
        record = self.record
        return f"{record.session_id} — {record.description} — {self.status}"
