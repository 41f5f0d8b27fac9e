"""Searching a tree's mail: which accepted messages a query matches, and how many a search may return. Pure.

A query is by text (case-insensitive, in the body), by sender (session id or
handle) and by time (``since`` <= accepted at < ``until``); every given
criterion must hold. Results are bounded: at most ``MAX_LIMIT`` per search,
newest first; a search with more matches says so with a cursor that names the
last row shown (its time and id), so the next page starts exactly after it:
paging by ``until`` alone would skip the messages accepted at the same time
as the last one shown.
"""

from dataclasses import dataclass

from . import events as ev

DEFAULT_LIMIT = 20
MAX_LIMIT = 100
MAX_TEXT_CHARS = 200


@dataclass(frozen=True)
class MailQuery:
    text: str | None = None
    sender: str | None = None
    since: float | None = None
    until: float | None = None
    limit: int = DEFAULT_LIMIT


def checked(query: MailQuery) -> MailQuery:
    """The query, or ValueError saying which criterion is out of bounds."""
    if not isinstance(query.limit, int) or isinstance(query.limit, bool) or not 1 <= query.limit <= MAX_LIMIT:
        raise ValueError(f"limit must be a whole number from 1 to {MAX_LIMIT}")
    if query.text is not None and not (isinstance(query.text, str) and 0 < len(query.text.strip())
                                       and len(query.text) <= MAX_TEXT_CHARS):
        raise ValueError(f"text must be 1 to {MAX_TEXT_CHARS} characters")
    if query.sender is not None and not (isinstance(query.sender, str) and query.sender):
        raise ValueError("sender must be a session id or a handle")
    for name in ("since", "until"):
        value = getattr(query, name)
        if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))):
            raise ValueError(f"{name} must be a time in seconds since the epoch")
    return query


def matches(event: ev.ProducerMessageAccepted, query: MailQuery) -> bool:
    if query.text is not None and query.text.strip().casefold() not in event.body.casefold():
        return False
    if query.sender is not None and query.sender not in (event.sender_session_id, event.sender_handle):
        return False
    if query.since is not None and event.at < query.since:
        return False
    return query.until is None or event.at < query.until


def cursor_of(row: dict) -> str:
    return f"{row['message_id']}@{row['at']!r}"


def cursor_key(cursor: str) -> tuple[float, str]:
    """The (accepted at, message id) a cursor names; ValueError for a text no page handed out."""
    if not isinstance(cursor, str) or "@" not in cursor or len(cursor) > 200:
        raise ValueError("cursor must be the next_cursor of a previous search")
    message_id, _, at = cursor.rpartition("@")
    try:
        return float(at), message_id
    except ValueError:
        raise ValueError("cursor must be the next_cursor of a previous search") from None


def page(rows: list[dict], limit: int, cursor: str | None) -> tuple[list[dict], str | None]:
    """At most ``limit`` of ``rows`` (newest first by accepted time, then id) after ``cursor``, and the cursor
    of the next page (None when nothing older matches)."""
    rows = sorted(rows, key=lambda row: (row["at"], row["message_id"]), reverse=True)
    if cursor is not None:
        key = cursor_key(cursor)
        rows = [row for row in rows if (row["at"], row["message_id"]) < key]
    shown = rows[:limit]
    return shown, (cursor_of(shown[-1]) if len(rows) > limit else None)
