"""The wire format of a SendMessage command on a command stream (one ``__data__`` field, compact JSON).

Every command carries the protocol version it was written with (``v``); a
worker refuses one from a newer protocol (``NewerProtocol``) rather than guess.

Whatever reads the stream checks every entry alone: a producer of another
version (or anything else with server access) can write entries that parse
as JSON but are no command this version decides (``to=123``,
``mode="bogus"``). Those raise ``InvalidCommand`` with the reason and, when
they can be read, the id and reply list to answer; they must never reach a
decision, where one of them would fail the whole batch.
"""

import json

import orjson

from ..domain.protocol import PROTOCOL_VERSION
from ..domain import blocks, compactjson, limits, protocol
from ..domain.commands import SendArguments, SendContext, SendMessage
from ..domain.decide.mailcontrol import require_send_options
from ..domain.errors import TreemailError

MODES = ("steer", "queue")
# An id or reply list longer than this is not one a producer wrote.
MAX_ID_CHARS = 200


class InvalidCommand(TreemailError, ValueError):
    """Valid JSON, but not a command; ``command_id`` and ``reply_to`` are set when they can be answered."""

    code = "command:invalid"

    def __init__(self, reason: str, command_id: str | None = None, reply_to: str | None = None) -> None:
        super().__init__(reason)
        self.reason = reason
        self.command_id = command_id
        self.reply_to = reply_to


def encode_answer(command_id: str, outcome: dict) -> str:
    """The reply a producer reads from its list: the decision's outcome, under the command's id."""
    return compactjson.dumps({"command_id": command_id, **outcome})


def encode_command(command: SendMessage) -> str:
    c, a = command.context, command.arguments
    args = [a.to, a.body, a.mode]
    if a.blocks:
        # Content blocks ride as a fourth argument; a plain send is encoded as before.
        args.append(blocks.to_json(a.blocks))
    data = {
        "v": PROTOCOL_VERSION,
        "id": command.command_id,
        "ctx": [c.session_id, c.run_id, c.tool_call_id],
        "args": args,
        "reply_to": command.reply_to,
    }
    if command.traceparent:
        data["tp"] = command.traceparent  # tracing: the preparation's trace continues in the worker
    if a.in_reply_to:
        data["th"] = [a.in_reply_to, a.thread_id]  # threads: only an answer carries them
    if a.expires_in_s is not None or a.supersede_key is not None:
        data["mc"] = [a.expires_in_s, a.supersede_key]  # expiry and supersede: only a send that uses them
    if a.urgent:
        data["u"] = True  # order and priority: only an urgent send carries it
    if a.numbered:
        data["n"] = True  # order and priority: only a send whose host asked for its number carries it
    return json.dumps(data, separators=(",", ":"))


def _is_text(value) -> bool:
    if not isinstance(value, str):
        return False
    try:
        value.encode("utf-8")  # a JSON "\ud800" escape decodes to a lone surrogate no store accepts
    except UnicodeEncodeError:
        return False
    return True


def _is_str(value) -> bool:
    return isinstance(value, str)


def _identifier(value, is_text) -> str | None:
    return value if is_text(value) and 0 < len(value) <= MAX_ID_CHARS else None


def _type_name(value) -> str:
    return "a string with a lone surrogate" if isinstance(value, str) else type(value).__name__


def parse_command(data: str | bytes, *, check_version: bool = True) -> SendMessage:
    """The command; ``ValueError`` for an entry that is not JSON, ``InvalidCommand`` for one that is no
    command, ``NewerProtocol`` for one a newer treemail wrote (``check_version=False`` reads it anyway,
    to answer its producer)."""
    try:
        # orjson refuses a lone surrogate: every string it reads is text a store accepts.
        decoded, is_text = orjson.loads(data), _is_str
    except orjson.JSONDecodeError:
        # What orjson refuses and the standard library reads (a lone surrogate, NaN, a huge integer) is
        # judged as before: as an invalid command, answered to its producer, rather than as no JSON at all.
        decoded, is_text = json.loads(data), _is_text
    if not isinstance(decoded, dict):
        raise InvalidCommand(f"the entry is a JSON {type(decoded).__name__}, not an object")
    if check_version:
        protocol.require_known(decoded.get("v"), f"command {decoded.get('id')}")
    command_id, reply_to = _identifier(decoded.get("id"), is_text), _identifier(decoded.get("reply_to"), is_text)

    def invalid(reason: str) -> InvalidCommand:
        return InvalidCommand(reason, command_id, reply_to)

    if command_id is None or reply_to is None:
        raise invalid("`id` and `reply_to` must be short strings")
    ctx, args = decoded.get("ctx"), decoded.get("args")
    if not (isinstance(ctx, list) and len(ctx) == 3):
        raise invalid("`ctx` must be [session id, run id, tool call id]")
    if not (isinstance(args, list) and len(args) in (3, 4)):
        raise invalid("`args` must be [to, body, mode] (and content blocks)")
    for name, value in zip(("session id", "run id", "tool call id", "to", "body"), [*ctx, *args[:2]]):
        if not is_text(value):
            raise invalid(f"`{name}` must be a string, not {_type_name(value)}")
    if args[2] not in MODES:
        raise invalid("`mode` must be \"steer\" or \"queue\"")
    try:
        parsed_blocks = blocks.parse_blocks(args[3]) if len(args) == 4 else None
    except (ValueError, TypeError, KeyError) as exc:
        raise invalid(f"content blocks: {exc}") from None
    traceparent = decoded.get("tp", "")
    if not is_text(traceparent):
        raise invalid("`tp` must be a traceparent string")
    thread = decoded.get("th", [None, None])
    if not (isinstance(thread, list) and len(thread) == 2 and all(t is None or is_text(t) for t in thread)):
        raise invalid("`th` must be [in reply to, thread id]")
    control = decoded.get("mc", [None, None])
    try:
        if not (isinstance(control, list) and len(control) == 2):
            raise ValueError("must be [expires in seconds, supersede key]")
        require_send_options(*control)
    except ValueError as error:
        raise invalid(f"`mc` {getattr(error, 'message', error)}") from None
    urgent = decoded.get("u", False)
    if not isinstance(urgent, bool):
        raise invalid("`u` must be true or false")
    numbered = decoded.get("n", False)
    if not isinstance(numbered, bool):
        raise invalid("`n` must be true or false")
    sid, run, call = ctx
    to, body, mode = args[:3]
    try:
        context = SendContext(sid, run, call)
    except limits.IdentifierError as error:
        # A producer older than the limits (or not this one) sent it: refused like any malformed command.
        raise invalid(error.message) from None
    return SendMessage(
        command_id, context, SendArguments(to, body, mode, parsed_blocks, *thread, *control, urgent, numbered),
        reply_to,
        traceparent
    )
