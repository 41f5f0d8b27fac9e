"""Model-facing ``search_mail``: a session searches the mail it sent and received; a host installs it.

Identity comes from the host's context, never from the arguments; a model
reads only its own mail (``tm.history.search(..., own=True)``), bounded like
every search (at most ``domain.search.MAX_LIMIT`` results).
"""

import json
from typing import Any

from treemail.domain import search
from treemail.domain.results import error_result

TOOL_NAME = "search_mail"
INVALID = f"{TOOL_NAME}:invalid_arguments"
FIELDS = {"text", "sender", "since", "until", "limit", "cursor"}


def tool_definition() -> dict:
    return {
        "name": TOOL_NAME,
        "description": (
            "Search the messages you sent and received, newest first: by `text` in the body, by `sender` "
            "(a handle or session id), by time (`since`, `until`: seconds since the epoch). At most "
            f"`limit` results (default {search.DEFAULT_LIMIT}, at most {search.MAX_LIMIT}); when more match, "
            "`next_cursor` is not null: pass it as `cursor` for the next page."
        ),
        "input_schema": {
            "type": "object",
            "properties": {
                "text": {"type": "string", "description": "Words the body contains (any case)."},
                "sender": {"type": "string", "description": "Who sent it: a handle or a session id."},
                "since": {"type": "number", "description": "Accepted at or after this time."},
                "until": {"type": "number", "description": "Accepted before this time."},
                "limit": {"type": "integer", "minimum": 1, "maximum": search.MAX_LIMIT},
                "cursor": {"type": "string", "description": "The `next_cursor` of the previous page."},
            },
            "additionalProperties": False,
        },
    }


def parse_arguments(raw: Any) -> tuple[search.MailQuery, str | None] | dict:
    """The query and the cursor of the page asked for, or the invalid_arguments error to return."""
    if isinstance(raw, (str, bytes, bytearray)):
        try:
            raw = json.loads(raw)
        except (ValueError, UnicodeDecodeError, RecursionError):
            raw = None
    if not isinstance(raw, dict) or set(raw) - FIELDS:
        return error_result(INVALID, f"arguments may be only {', '.join(sorted(FIELDS))}")
    try:
        cursor = raw.get("cursor")
        if cursor is not None:
            search.cursor_key(cursor)
        return search.checked(search.MailQuery(raw.get("text"), raw.get("sender"), raw.get("since"), raw.get("until"),
                                               raw.get("limit", search.DEFAULT_LIMIT))), cursor
    except ValueError as invalid:
        return error_result(INVALID, str(invalid))


def result_text(result: dict) -> str:
    rows = result["messages"]
    if not rows:
        return "No message matches."
    text = "\n".join(f"[{row['message_id']}] from {row['from']} to {row['to']}: {row['body']}" for row in rows)
    if result.get("next_cursor"):
        # A bounded page never ends silently: the model is told more match, and how to read them.
        text += f"\n(more messages match: call search_mail again with cursor=\"{result['next_cursor']}\")"
    return text


async def call(history, context, arguments) -> dict:
    """The tool's call through the host's history part: the caller's own mail only."""
    parsed = parse_arguments(arguments)
    if isinstance(parsed, dict):
        return parsed
    query, cursor = parsed
    return await history.search_page(
        context.session_id, text=query.text, sender=query.sender, since=query.since, until=query.until,
        limit=query.limit, own=True, cursor=cursor)
