"""``tm.history``: a session's events, past and live, and the engine's moves through them.

``await tm.history(session_id)`` is the session's events in order (the
part is callable); ``position``, ``revert`` and ``fork`` follow the engine's
own log (mail follows the session's log; see ``domain/decide/branches.py``);
``subscribe`` is every session's mail events as they are appended
(``services/subscriptions.py``); ``search`` finds a tree's mail by text, sender and time.
"""

from treemail.domain import commands as c
from treemail.domain import events as ev
from treemail.domain import limits
from treemail.domain import search as mail_search
from treemail.domain.commands import SendArguments
from treemail.domain.decide import ordering
from treemail.domain.errors import Code, NotFound
from treemail.domain.search import MailQuery
from treemail.services.drains import DrainService
from treemail.services.subscriptions import MAIL_EVENTS, Subscriptions

from .sending import joined_thread
from .shared import Part, Shared
from .types import Registration


class History(Part):
    def __init__(self, shared: Shared, drains: DrainService, subscriptions: Subscriptions) -> None:
        super().__init__(shared)
        self._drains = drains
        self._subscriptions = subscriptions

    async def __call__(self, session_id: str) -> list[tuple[int, ev.Event]]:
        return await self._reader.history(await self._reader.record(session_id))

    async def position(self, session_id: str) -> int:
        """The session's current stream position: note it beside the engine's own log to revert or fork there."""
        return await self._reader.version(session_id)

    async def revert(self, session_id: str, to_position: int) -> list[str]:
        """The engine reverted the session's history to ``to_position``. Returns the mail due again.

        Claims and consumptions after that position are undone (released, restored); mail accepted after it
        stays pending; an open run ends. Raises LifecycleError ``lifecycle:invalid_position`` for a position
        outside the history or on a branch already reverted.
        """
        events = await self._sessions.execute(c.RevertSession(session_id, to_position))
        undone = (ev.ProducerMessageRestored, ev.ProducerMessageReleased)
        return [e.message_id for e in events if isinstance(e, undone)]

    async def read_receipt(self, sender_session_id: str, recipient_session_id: str) -> dict:
        """The directed pair's read receipt, read from the recipient: ``sent_through``, the number of the last
        message the sender landed there, and ``consumed_through``, the highest N such that every message of
        the pair numbered up to N is done (consumed, or discarded). "Has it read my message N?" is
        ``consumed_through >= N``, N being the ``sequence`` of that send's result. Raises ``NotFound`` (a
        KeyError) for an unknown recipient."""
        limits.require_id("sender_session_id", sender_session_id)  # before any read, whatever its size
        limits.require_id("recipient_session_id", recipient_session_id)
        record = await self._reader.find(recipient_session_id)
        if record is None:
            raise NotFound(Code.RECEIPT_UNKNOWN_RECIPIENT.value,
                           f"no session has id {limits.shown(recipient_session_id)}")
        state = await self._reader.state(record)
        positions = ordering.pending_from(await self._reader.mail(record), sender_session_id)
        accepted = await self._reader.read_at(record, positions) if positions else {}
        numbers = [getattr(accepted.get(position), "pair_seq", None) for position in positions]
        return {
            "sender_session_id": sender_session_id, "recipient_session_id": recipient_session_id,
            "sent_through": ordering.sent_through(state, sender_session_id),
            "consumed_through": ordering.consumed_through(state, numbers, sender_session_id),
        }

    async def fork(
        self, session_id: str, at_position: int, *, description: str | None = None, status: str = "idle"
    ) -> Registration:
        """A new session (own id and handle, same tree and origin) forked from ``session_id`` at ``at_position``.

        The source's pending mail stays with the source (it is delivered once, there). A fork below a
        draining session drains too (drains reach down the tree), as any session registered there does.
        """
        record = await self._sessions.fork(session_id, at_position, description=description, status=status)
        if record.parent_session_id is not None:
            await self._drains.inherit(record)
        return Registration(record.session_id, record.handle, record.root_session_id)

    # ---- live: every session's mail events ------------------------------------------------------------------

    async def subscription_position(self) -> str:
        """Where every feed ends now: ``subscribe(after=...)`` from it misses nothing appended later."""
        return await self._subscriptions.position()

    def subscribe(self, after: str | None = None, *, types=MAIL_EVENTS, block_ms: int = 1000):
        """Every session's mail events as ``(position, session_id, event)``, live, until the host closes.

        ``after``: None (from now), ``"start"`` (from the oldest event the feeds hold) or a position yielded
        earlier (resume after it). ``types=None`` yields every event type.
        """
        return self._subscriptions.subscribe(after, types, block_ms)

    # ---- threads --------------------------------------------------------------------------------------

    async def joined_thread(self, session_id: str, arguments: SendArguments) -> SendArguments:
        """The send answering ``arguments.in_reply_to`` joins that message's thread; only a message the sender
        received can be answered (``send_message:unknown_reply`` otherwise: an id never reads another's mail)."""
        return await joined_thread(self._reader, session_id, arguments)

    async def thread(self, session_id: str, message_id: str) -> list[dict]:
        """The conversation ``message_id`` belongs to, in ``session_id``'s tree, oldest first: every message
        of its thread (rows as ``search`` gives them, with ``thread_id``). Empty if the tree holds no such
        message."""
        record = await self._reader.record(session_id)
        rows = await self._tree_rows(record)
        thread_id = next((row["thread_id"] for row in rows if row["message_id"] == message_id), None)
        if thread_id is None:
            return []
        return sorted((row for row in rows if row["thread_id"] == thread_id), key=lambda row: (row["at"], row["position"]))

    async def _tree_rows(self, record, query: MailQuery | None = None) -> list[dict]:
        return [
            _found(member, seq, event)
            for member in await self._reader.tree(record) for seq, event in await self._reader.history(member)
            if isinstance(event, ev.ProducerMessageAccepted) and (query is None or mail_search.matches(event, query))
        ]

    # ---- search ---------------------------------------------------------------------------------------

    async def search(self, session_id: str, *, text: str | None = None, sender: str | None = None,
                     since: float | None = None, until: float | None = None,
                     limit: int = mail_search.DEFAULT_LIMIT, own: bool = False) -> list[dict]:
        """The mail of ``session_id``'s tree matching every given criterion, newest first, at most ``limit``
        (1 to 100). ``text``: in the body, any case; ``sender``: a session id or handle; ``since`` <=
        accepted at < ``until`` (seconds since the epoch). ``own``: only mail the session sent or received
        (what a model may read about itself: the ``search_mail`` tool). Raises ValueError for a criterion
        out of bounds, UnknownSessionError for an unknown session."""
        return (await self.search_page(session_id, text=text, sender=sender, since=since, until=until,
                                       limit=limit, own=own))["messages"]

    async def search_page(self, session_id: str, *, text: str | None = None, sender: str | None = None,
                          since: float | None = None, until: float | None = None,
                          limit: int = mail_search.DEFAULT_LIMIT, own: bool = False,
                          cursor: str | None = None) -> dict:
        """A page of ``search``: ``{"messages": [...]}``, with ``"next_cursor"`` while older results remain;
        ``cursor``: the previous page's, for the page after it. A cursor pages only the search that gave it
        (the same session, ``own`` and criteria; the limit may change): any other is a ValueError."""
        query = mail_search.checked(MailQuery(text, sender, since, until, limit, cursor))
        record = await self._reader.record(session_id)
        key = mail_search.search_key(record.session_id, own, query)
        after = mail_search.position_of(cursor, key) if cursor is not None else None
        found = await self._tree_rows(record, query)
        if own:  # what it received, and what it sent (on its recipients' streams)
            found = [row for row in found
                     if record.session_id in (row["recipient_session_id"], row["sender_session_id"])]
        found.sort(key=lambda row: (row["at"], row["message_id"]), reverse=True)
        rows, more = mail_search.page(found, query.limit, after)
        return {"messages": rows, **({"next_cursor": mail_search.cursor_after(rows[-1], key)} if more else {})}


def _found(recipient, seq: int, event: ev.ProducerMessageAccepted) -> dict:
    return {
        "message_id": event.message_id, "at": event.at, "from": event.sender_handle or event.sender_session_id,
        "sender_session_id": event.sender_session_id, "to": recipient.handle or recipient.session_id,
        "recipient_session_id": recipient.session_id, "owner": event.owner, "mode": event.mode,
        "body": event.body, "in_reply_to": event.in_reply_to, "thread_id": event.thread_of,
        "position": seq,
    }
