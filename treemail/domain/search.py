"""Searching a tree's mail: which accepted messages a query matches, and how many a search may return. Pure.

A query is by text (case-insensitive, in the body), by sender (session id or
handle) and by time (``since`` <= accepted at < ``until``); every given
criterion must hold. Results come newest first, a page at a time: at most
``MAX_LIMIT`` per page, and a cursor where more remain. A cursor names where
its page ended and which search it continues (the searcher and the criteria),
so it pages that search only: given to another session's search, or with other
criteria, it is refused rather than read as a position in someone else's mail.
"""

import base64
import binascii
import hashlib
import json
from dataclasses import dataclass

from . import events as ev
from .errors import InvalidRequest

DEFAULT_LIMIT = 20
MAX_LIMIT = 100
MAX_TEXT_CHARS = 200
# A cursor is a search's digest, a time and a message id: far under this.
MAX_CURSOR_CHARS = 200


@dataclass(frozen=True)
class MailQuery:
    text: str | None = None
    sender: str | None = None
    since: float | None = None
    until: float | None = None
    limit: int = DEFAULT_LIMIT
    # The previous page's ``next_cursor``: the results after it, older.
    cursor: str | None = None


def checked(query: MailQuery) -> MailQuery:
    """The query, or ``InvalidRequest`` (a ValueError) saying which criterion is out of bounds."""
    if not isinstance(query.limit, int) or isinstance(query.limit, bool) or not 1 <= query.limit <= MAX_LIMIT:
        raise _invalid(f"limit must be a whole number from 1 to {MAX_LIMIT}")
    if query.text is not None and not (isinstance(query.text, str) and 0 < len(query.text.strip())
                                       and len(query.text) <= MAX_TEXT_CHARS):
        raise _invalid(f"text must be 1 to {MAX_TEXT_CHARS} characters")
    if query.sender is not None and not (isinstance(query.sender, str) and query.sender):
        raise _invalid("sender must be a session id or a handle")
    if query.cursor is not None and not (isinstance(query.cursor, str) and 0 < len(query.cursor) <= MAX_CURSOR_CHARS):
        raise _invalid("cursor must be the next_cursor of an earlier page of this search")
    for name in ("since", "until"):
        value = getattr(query, name)
        if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))):
            raise _invalid(f"{name} must be a time in seconds since the epoch")
    return query


def matches(event: ev.ProducerMessageAccepted, query: MailQuery) -> bool:
    if query.text is not None and query.text.strip().casefold() not in event.body.casefold():
        return False
    if query.sender is not None and query.sender not in (event.sender_session_id, event.sender_handle):
        return False
    if query.since is not None and event.at < query.since:
        return False
    return query.until is None or event.at < query.until


def search_key(searcher_session_id: str, own: bool, query: MailQuery) -> str:
    """Which search a cursor continues: who searches (so whose tree, and whose own mail) and by what (the page
    size may change from page to page)."""
    # Criteria as the search reads them: "Cache " and "cache", 1767225600 and 1767225600.0 are one search.
    text = None if query.text is None else query.text.strip().casefold()
    since, until = (None if t is None else float(t) for t in (query.since, query.until))
    named = json.dumps([searcher_session_id, own, text, query.sender, since, until])
    return hashlib.sha256(named.encode()).hexdigest()[:16]


def cursor_after(row: dict, key: str) -> str:
    """The cursor for the results older than ``row`` (a result: its ``at`` and ``message_id``) in search ``key``."""
    packed = json.dumps([key, row["at"], row["message_id"]], separators=(",", ":"))
    return base64.urlsafe_b64encode(packed.encode()).decode().rstrip("=")


def position_of(cursor: str, key: str) -> tuple[float, str]:
    """Where the page before ``cursor`` ended in search ``key``; ``InvalidRequest`` for a cursor of no page of it."""
    try:
        packed = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4))
        named, at, message_id = json.loads(packed)
    except (ValueError, TypeError, binascii.Error, UnicodeDecodeError, RecursionError):
        raise _invalid("cursor must be the next_cursor of an earlier page of this search") from None
    if named != key or isinstance(at, bool) or not isinstance(at, (int, float)) or not isinstance(message_id, str):
        raise _invalid("cursor belongs to another search (other criteria, or another session's)")
    return at, message_id


def page(rows: list[dict], limit: int, after: tuple[float, str] | None) -> tuple[list[dict], bool]:
    """``rows`` newest first (by ``at``, then ``message_id``): at most ``limit`` of those older than ``after``,
    and whether more remain."""
    older = rows if after is None else [row for row in rows if (row["at"], row["message_id"]) < after]
    return older[:limit], len(older) > limit


# What the search_mail tool answers too: a host caller and a model read the same code.
INVALID_ARGUMENTS = "search_mail:invalid_arguments"


def _invalid(message: str) -> InvalidRequest:
    return InvalidRequest(INVALID_ARGUMENTS, message)
