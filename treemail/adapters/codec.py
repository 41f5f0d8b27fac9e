"""The wire format of a SendMessage command on a command stream (one ``__data__`` field, compact JSON)."""

import json

from ..domain.commands import SendArguments, SendContext, SendMessage


def encode_command(command: SendMessage) -> str:
    c, a = command.context, command.arguments
    data = {
        "id": command.command_id,
        "ctx": [c.session_id, c.run_id, c.tool_call_id],
        "args": [a.to, a.body, a.mode],
        "reply_to": command.reply_to,
    }
    if command.traceparent:
        data["tp"] = command.traceparent  # seed 004: the preparation's trace continues in the worker
    return json.dumps(data, separators=(",", ":"))


def parse_command(data: str | bytes) -> SendMessage:
    """The command, or an exception for an entry that never will be one."""
    decoded = json.loads(data)
    sid, run, call = decoded["ctx"]
    to, body, mode = decoded["args"]
    return SendMessage(decoded["id"], SendContext(sid, run, call), SendArguments(to, body, mode), decoded["reply_to"],
                       decoded.get("tp", ""))
