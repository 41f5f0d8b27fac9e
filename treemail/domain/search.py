"""Searching a tree's mail: which accepted messages a query matches, and how many a search may return. Pure.

A query is by text (case-insensitive, in the body), by sender (session id or
handle) and by time (``since`` <= accepted at < ``until``); every given
criterion must hold. Results are bounded: at most ``MAX_LIMIT`` per search.
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
