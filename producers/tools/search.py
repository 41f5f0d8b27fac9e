"""Model-facing ``search_mail``: a session searches the mail it sent and received; a host installs it.

Identity comes from the host's context, never from the arguments; a model
reads only its own mail (``tm.history.search_page(..., own=True)``), a page at
a time like every search (at most ``domain.search.MAX_LIMIT`` results a page,
and a ``next_cursor`` while more remain, which pages only this search).
"""

import json
from typing import Any

from treemail.domain import search
from treemail.domain.errors import InvalidRequest
from treemail.domain.results import error_result

TOOL_NAME = "search_mail"
INVALID = search.INVALID_ARGUMENTS
FIELDS = {"text", "sender", "since", "until", "limit", "cursor"}


def tool_definition() -> dict:
    return {
        "name": TOOL_NAME,
        "description": (
            "Search the messages you sent and received, newest first: by `text` in the body, by `sender` "
            "(a handle or session id), by time (`since`, `until`: seconds since the epoch). At most "
            f"`limit` results (default {search.DEFAULT_LIMIT}, at most {search.MAX_LIMIT}); when more remain the "
            "result has a `next_cursor`: search again with the same criteria and `cursor` set to it for the next, "
            "older ones."
        ),
        "input_schema": {
            "type": "object",
            "properties": {
                "text": {"type": "string", "description": "Words the body contains (any case)."},
                "sender": {"type": "string", "description": "Who sent it: a handle or a session id."},
                "since": {"type": "number", "description": "Accepted at or after this time."},
                "until": {"type": "number", "description": "Accepted before this time."},
                "limit": {"type": "integer", "minimum": 1, "maximum": search.MAX_LIMIT},
                "cursor": {"type": "string", "description": "The next_cursor of the previous page of this search."},
            },
            "additionalProperties": False,
        },
    }


def parse_arguments(raw: Any) -> search.MailQuery | dict:
    """The query, or the invalid_arguments error to return."""
    if isinstance(raw, (str, bytes, bytearray)):
        try:
            raw = json.loads(raw)
        except (ValueError, UnicodeDecodeError, RecursionError):
            raw = None
    if not isinstance(raw, dict) or set(raw) - FIELDS:
        return error_result(INVALID, f"arguments may be only {', '.join(sorted(FIELDS))}")
    try:
        return search.checked(search.MailQuery(raw.get("text"), raw.get("sender"), raw.get("since"), raw.get("until"),
                                               raw.get("limit", search.DEFAULT_LIMIT), raw.get("cursor")))
    except InvalidRequest as invalid:
        return error_result(INVALID, invalid.message)


def result_text(result: dict) -> str:
    rows = result["messages"]
    if not rows:
        return "No message matches."
    lines = [f"[{row['message_id']}] from {row['from']} to {row['to']}: {row['body']}" for row in rows]
    if "next_cursor" in result:
        lines.append(f'More match: search again with cursor="{result["next_cursor"]}" for older ones.')
    return "\n".join(lines)


async def call(history, context, arguments) -> dict:
    """The tool's call through the host's history part: the caller's own mail only."""
    query = parse_arguments(arguments)
    if isinstance(query, dict):
        return query
    try:
        return await history.search_page(
            context.session_id, text=query.text, sender=query.sender, since=query.since, until=query.until,
            limit=query.limit, own=True, cursor=query.cursor)
    except InvalidRequest as invalid:  # a cursor of no page of this search
        return error_result(INVALID, invalid.message)
