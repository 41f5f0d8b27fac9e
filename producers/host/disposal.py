"""Seed 002 in the host API: disposal, drains, return guidance, and the settlement a finish may owe.

A part of ``Treemail`` (like ``InterruptHost`` and ``PeerHost``), so the
facade stays wiring: each method here is one call into ``services``.
"""

from treemail.domain import notices
from treemail.domain.commands import STOP_REASONS
from treemail.services.disposal import Disposed, DisposalService
from treemail.services.drains import DrainService
from treemail.services.settlement import SettlementService


def check_stop_reason(reason: str | None) -> None:
    if reason is not None and reason not in STOP_REASONS:
        raise ValueError(f"reason must be one of {', '.join(STOP_REASONS)}, got {reason!r}")


class DisposalHost:
    def _init_disposal(self) -> None:
        self.settlement = SettlementService(self.store, self.sessions)
        self.disposal = DisposalService(self.store, self.sessions, self.settlement)
        self.drains = DrainService(self.store, self.sessions)

    async def dispose(self, session_id: str, reason: str | None = None, closing_text: str | None = None) -> Disposed:
        """Closing (the cutoff: sends to and from it are refused), pending agent mail returned to its
        senders as notices, closed; then, with a stop ``reason``, the parent's settlement notice.
        Safe to call again to complete a disposal that was interrupted."""
        check_stop_reason(reason)
        return await self.disposal.dispose(session_id, reason, closing_text)

    async def drain(self, session_id: str | None = None) -> int:
        """Refuse new sends from or to the whole service (no ``session_id``) or this session and every
        session below it (``send_message:draining``); accepted mail is still delivered. Returns the number
        of sessions now draining because of this call (0 for the whole service)."""
        return await self.drains.drain(session_id)

    async def undrain(self, session_id: str | None = None) -> int:
        return await self.drains.undrain(session_id)

    async def return_guidance(self, session_id: str) -> str | None:
        """The sentence to append to a child's first prompt, or None when it cannot message its parent
        (no tool, its effective rules deny its parent, or the routing policy does not reach it)."""
        record = await self.sessions.record(session_id)
        if record.parent_session_id is None:
            return None
        parent = await self.store.directory.get(record.parent_session_id)
        overlay = (await self.store.load(record)).state.rules_overlay
        return notices.return_guidance_for(record, parent, overlay, self.config.messaging.routing)
