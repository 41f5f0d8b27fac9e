"""``tm.disposal``: disposing of a session and draining sends, each one call into ``services``.

Disposal cutoff: from ``closing`` on, sends to and from the session are
refused; its pending agent mail goes back to the senders as notices, then it
is closed. A drain refuses new sends (``send_message:draining``) while
accepted mail is still delivered.
"""

from treemail.services.disposal import Disposed, DisposalService
from treemail.services.drains import DrainService
from treemail.services.settlement import check_closing_text, check_stop_reason

__all__ = ["Disposal", "Disposed", "check_closing_text", "check_stop_reason"]


class Disposal:
    def __init__(self, disposal: DisposalService, drains: DrainService) -> None:
        self._disposal = disposal
        self._drains = drains

    async def dispose(self, session_id: str, reason: str | None = None, closing_text: str | None = None) -> Disposed:
        """Closing (the cutoff: sends to and from it are refused), pending agent mail returned to its
        senders as notices, closed; then, with a stop ``reason``, the parent's settlement notice.
        Safe to call again to complete a disposal that was interrupted."""
        check_stop_reason(reason)
        check_closing_text(closing_text)
        return await self._disposal.dispose(session_id, reason, closing_text)

    async def drain(self, session_id: str | None = None) -> int:
        """Refuse new sends from or to the whole service (no ``session_id``) or this session and every
        session below it (``send_message:draining``); accepted mail is still delivered. Returns the number
        of sessions now draining because of this call (0 for the whole service)."""
        return await self._drains.drain(session_id)

    async def undrain(self, session_id: str | None = None) -> int:
        return await self._drains.undrain(session_id)
