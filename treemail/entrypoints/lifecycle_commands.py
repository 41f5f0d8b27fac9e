"""Operators' drain and dispose commands, for the CLI to wire: each takes a connected host and returns its one line.

    treemail drain [SESSION]            drain_command(host, session_id)
    treemail drain --lift [SESSION]     drain_command(host, session_id, lift=True)
    treemail dispose SESSION [--stop-reason R] [--closing-text T]   dispose_command(host, ...)
"""

from treemail.host import Treemail


async def drain_command(host: Treemail, session_id: str | None = None, lift: bool = False) -> str:
    if lift:
        count = await host.disposal.undrain(session_id)
        return "the service takes new sends again" if session_id is None else f"{count} sessions take new sends again"
    count = await host.disposal.drain(session_id)
    if session_id is None:
        return "the service is draining: new sends are refused (send_message:draining), accepted mail is delivered"
    return f"{count} sessions draining: new sends from or to them are refused, accepted mail is delivered"


async def dispose_command(
    host: Treemail, session_id: str, stop_reason: str | None = None, closing_text: str | None = None
) -> str:
    disposed = await host.disposal.dispose(session_id, stop_reason, closing_text)
    notice = f"; parent notice: {disposed.settlement}" if disposed.settlement else ""
    return f"disposed {session_id}: {len(disposed.returned)} unprocessed messages returned to their senders{notice}"
