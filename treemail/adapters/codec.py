"""The wire format of a SendMessage command on a command stream (one ``__data__`` field, compact JSON).

Every command carries the protocol version it was written with (``v``); a
worker refuses one from a newer protocol (``NewerProtocol``) rather than guess.
"""

import json

from .. import PROTOCOL_VERSION
from ..domain import blocks, protocol
from ..domain.commands import SendArguments, SendContext, SendMessage


def encode_command(command: SendMessage) -> str:
    c, a = command.context, command.arguments
    args = [a.to, a.body, a.mode]
    if a.blocks:
        # Content blocks (seed 002 part 2) ride as a fourth argument; a plain send is encoded as before.
        args.append(blocks.to_json(a.blocks))
    data = {
        "v": PROTOCOL_VERSION,
        "id": command.command_id,
        "ctx": [c.session_id, c.run_id, c.tool_call_id],
        "args": args,
        "reply_to": command.reply_to,
    }
    if command.traceparent:
        data["tp"] = command.traceparent  # seed 004: the preparation's trace continues in the worker
    return json.dumps(data, separators=(",", ":"))


def parse_command(data: str | bytes, *, check_version: bool = True) -> SendMessage:
    """The command, or an exception for an entry that never will be one (``NewerProtocol`` for one a
    newer treemail wrote; ``check_version=False`` reads it anyway, to answer its producer)."""
    decoded = json.loads(data)
    if check_version:
        protocol.require_known(decoded.get("v"), f"command {decoded.get('id')}")
    sid, run, call = decoded["ctx"]
    to, body, mode, *rest = decoded["args"]
    parsed_blocks = blocks.parse_blocks(rest[0]) if rest else None
    return SendMessage(
        decoded["id"], SendContext(sid, run, call), SendArguments(to, body, mode, parsed_blocks), decoded["reply_to"],
        decoded.get("tp", ""),
    )
