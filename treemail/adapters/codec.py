"""The wire format of a SendMessage command on a command stream (one ``__data__`` field, compact JSON)."""

import json

from ..domain import blocks
from ..domain.commands import SendArguments, SendContext, SendMessage


def encode_command(command: SendMessage) -> str:
    c, a = command.context, command.arguments
    args = [a.to, a.body, a.mode]
    if a.blocks:
        # Content blocks (seed 002 part 2) ride as a fourth argument; a plain send is encoded as before.
        args.append(blocks.to_json(a.blocks))
    return json.dumps(
        {
            "id": command.command_id,
            "ctx": [c.session_id, c.run_id, c.tool_call_id],
            "args": args,
            "reply_to": command.reply_to,
        },
        separators=(",", ":"),
    )


def parse_command(data: str | bytes) -> SendMessage:
    """The command, or an exception for an entry that never will be one."""
    decoded = json.loads(data)
    sid, run, call = decoded["ctx"]
    to, body, mode, *rest = decoded["args"]
    parsed_blocks = blocks.parse_blocks(rest[0]) if rest else None
    return SendMessage(
        decoded["id"], SendContext(sid, run, call), SendArguments(to, body, mode, parsed_blocks), decoded["reply_to"]
    )
