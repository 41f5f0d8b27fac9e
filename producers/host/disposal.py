"""``tm.disposal``: disposing of a session and draining sends, each one call into ``services``.

Disposal cutoff: from ``closing`` on, sends to and from the session are
refused; its pending agent mail goes back to the senders as notices, then it
is closed. A drain refuses new sends (``send_message:draining``) while
accepted mail is still delivered. A cascading stop disposes or interrupts a
whole subtree, bottom-up.
"""

from treemail.services.disposal import Disposed, DisposalService
from treemail.services.drains import DrainService
from treemail.services.settlement import check_closing_text, check_stop_reason

from .subtree import Subtree

__all__ = ["Disposal", "Disposed", "check_closing_text", "check_stop_reason"]


class Disposal:
    def __init__(self, disposal: DisposalService, drains: DrainService, subtree: Subtree | None = None) -> None:
        self._disposal = disposal
        self._drains = drains
        self._subtree = subtree

    async def dispose(self, session_id: str, reason: str | None = None,
                      closing_text: str | list | None = None) -> Disposed:
        """Closing (the cutoff: sends to and from it are refused), pending agent mail returned to its
        senders as notices, closed; then, with a stop ``reason``, the parent's settlement notice.
        Safe to call again to complete a disposal that was interrupted."""
        check_stop_reason(reason)
        closing_text = check_closing_text(closing_text)
        return await self._disposal.dispose(session_id, reason, closing_text)

    async def drain(self, session_id: str | None = None) -> int:
        """Refuse new sends from or to the whole service (no ``session_id``) or this session and every
        session below it (``send_message:draining``); accepted mail is still delivered. Returns the number
        of sessions now draining because of this call (0 for the whole service)."""
        return await self._drains.drain(session_id)

    async def undrain(self, session_id: str | None = None) -> int:
        return await self._drains.undrain(session_id)

    async def stop_subtree(self, session_id: str, how: str = "dispose", *, reason: str | None = "aborted",
                           closing_text: str | None = None, idempotency_key: str | None = None) -> list[dict]:
        """Dispose (``how="dispose"``) or interrupt (``how="interrupt"``) this session and every session
        below it, bottom-up: each after all of its descendants, so the settlement notices arrive leaves
        first. One row per session, in the order stopped. See ``Subtree.stop``."""
        return await self._subtree.stop(session_id, how, reason=reason, closing_text=closing_text,
                                        idempotency_key=idempotency_key)
