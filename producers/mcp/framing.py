"""Judging one request before the SDK reads it: the message, or the error that answers it. Pure.

One rule for both transports: a stdio line (``stdio.py``) and a streamable HTTP body (``checkedhttp.py``)
are judged here alike, so the same bytes get the same answer whichever the client speaks.

The SDK's stdio reader hands a line it cannot read to the server as an
exception, and the server answers nothing: a client whose request held an
escaped lone surrogate (``"\\ud800"``, valid JSON that is not Unicode text),
or nested deeper than the SDK's parser goes, waited forever; not-JSON,
invalid UTF-8 (read with replacement characters, so a body was silently
changed) and a JSON-RPC object that is no message got no answer either.
Here every such line gets the error JSON-RPC names for it, with the
request's id whenever the line's top-level object names one (even in a
line that does not parse as a whole), so the caller's request ends:

- not UTF-8, not JSON, or nested too deep to read: -32700 (parse error);
- JSON that is not a JSON-RPC message (no method, a mistyped id, ...), a
  lone surrogate outside the params, or a message over ``MAX_FRAME_BYTES``:
  -32600 (invalid request);
- a lone surrogate in a request's params: -32602 (invalid params).

A notification (no id) and the client's own response are never answered,
except for a parse error, whose kind nobody can know.
"""

import json
import re
from typing import NamedTuple

from mcp.server.transport_security import DEFAULT_MAX_REQUEST_BODY_SIZE
from mcp_types import jsonrpc_message_adapter
from mcp_types.jsonrpc import INVALID_PARAMS, INVALID_REQUEST, PARSE_ERROR

from treemail.domain.limits import nesting_depth

# The SDK's own parser refuses a message nested about 200 levels deep; an MCP message nests a few levels.
MAX_DEPTH = 100
# The SDK's own bound on an HTTP body (4 MiB); a stdio line is held to it too, so both refuse the same message.
MAX_FRAME_BYTES = DEFAULT_MAX_REQUEST_BODY_SIZE
_WHITESPACE = " \t\n\r"


class Refusal(NamedTuple):
    """The error a line is answered with; ``id`` None: the JSON-RPC null id."""

    id: str | int | None
    code: int
    message: str


def judge(line: bytes) -> str | Refusal | None:
    """The line as the SDK should read it, the error to answer instead, or None (nothing to read or answer)."""
    if len(line) > MAX_FRAME_BYTES:  # the id is read from the part kept, if it comes before the bulk
        return Refusal(top_level_id(line[:MAX_FRAME_BYTES].decode("utf-8", "replace")), INVALID_REQUEST,
                       f"Invalid request: the message is over {MAX_FRAME_BYTES} bytes")
    try:
        text = line.decode("utf-8")
    except UnicodeDecodeError as error:
        return Refusal(top_level_id(line.decode("utf-8", "replace")), PARSE_ERROR,
                       f"Parse error: the line is not UTF-8 text (byte {error.start})")
    if not text.strip(_WHITESPACE):
        return None
    if nesting_depth(text) > MAX_DEPTH:
        return Refusal(top_level_id(text), PARSE_ERROR, f"Parse error: nested deeper than {MAX_DEPTH} levels")
    try:
        value = json.loads(text, parse_constant=_not_json)
    except (ValueError, RecursionError):
        return Refusal(top_level_id(text), PARSE_ERROR, "Parse error: the line is not JSON")
    request_id = _id_of(value)
    # Answering neither: a notification (JSON-RPC answers none), nor the client's response to a request of ours
    # (an answer to an answer could go back and forth for ever).
    is_notification = isinstance(value, dict) and "method" in value and "id" not in value
    is_response = isinstance(value, dict) and "method" not in value and ("result" in value or "error" in value)
    if isinstance(value, dict) and "method" in value and "id" in value and request_id is None:
        # MCP's ids are strings or whole numbers, never null; the SDK would take such a request for a notification.
        return Refusal(None, INVALID_REQUEST, "Invalid request: an id must be a string or a whole number")
    if isinstance(value, dict) and _holds_surrogate({k: v for k, v in value.items() if k != "params"}):
        if is_notification or is_response:
            return None
        return Refusal(request_id, INVALID_REQUEST, "Invalid request: a string holds a lone surrogate, not Unicode text")
    if isinstance(value, dict) and _holds_surrogate(value.get("params")):
        if is_notification or is_response:
            return None
        return Refusal(request_id, INVALID_PARAMS,
                       "Invalid params: a string holds a lone surrogate (an escape like \\ud800 alone), not Unicode text")
    checked = json.dumps(value, ensure_ascii=False, separators=(",", ":"))
    try:
        jsonrpc_message_adapter.validate_json(checked, by_name=False)
    except ValueError:
        if is_notification or is_response:
            return None
        return Refusal(request_id, INVALID_REQUEST, "Invalid request: not a JSON-RPC request, notification or response")
    return checked


def _not_json(constant: str):
    raise ValueError(f"{constant} is not JSON")


def _id_of(value) -> str | int | None:
    request_id = value.get("id") if isinstance(value, dict) else None
    if isinstance(request_id, bool) or not isinstance(request_id, (str, int)):
        return None
    return None if isinstance(request_id, str) and _holds_surrogate(request_id) else request_id


def _holds_surrogate(value) -> bool:
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            if _SURROGATE.search(item):
                return True
        elif isinstance(item, dict):
            stack.extend(item.keys())
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
    return False


_SURROGATE = re.compile("[\ud800-\udfff]")
def top_level_id(text: str) -> str | int | None:
    """The ``id`` member of a top-level object, read without reading its other members' values (which may
    nest too deep to parse); None when there is none or the text is not such an object."""
    decoder = json.JSONDecoder()
    at = _skip_space(text, 0)
    if not text.startswith("{", at):
        return None
    at += 1
    try:
        while True:
            at = _skip_space(text, at)
            if not text.startswith('"', at):
                return None
            key, at = json.decoder.scanstring(text, at + 1)
            at = _skip_space(text, at)
            if not text.startswith(":", at):
                return None
            at = _skip_space(text, at + 1)
            if key == "id":
                value, _ = decoder.raw_decode(text, at)
                return _id_of({"id": value})
            at = _skip_space(text, _skip_value(text, at))
            if not text.startswith(",", at):
                return None
            at += 1
    except (ValueError, RecursionError, IndexError):
        return None


def _skip_space(text: str, at: int) -> int:
    while at < len(text) and text[at] in _WHITESPACE:
        at += 1
    return at


def _skip_value(text: str, at: int) -> int:
    """The position just past the JSON value starting at ``at``, found by counting brackets (no recursion)."""
    if text.startswith('"', at):
        return json.decoder.scanstring(text, at + 1)[1]
    if at < len(text) and text[at] not in "[{":
        while at < len(text) and text[at] not in ",}]" + _WHITESPACE:
            at += 1
        return at
    depth, in_string, escaped = 0, False, False
    while at < len(text):
        ch = text[at]
        at += 1
        if in_string:
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == '"':
                in_string = False
        elif ch == '"':
            in_string = True
        elif ch in "[{":
            depth += 1
        elif ch in "]}":
            depth -= 1
            if depth == 0:
                return at
    raise ValueError("unterminated value")
