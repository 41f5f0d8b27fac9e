"""The envelope of mail that arrived over a peer route. Pure.

    <agent_message from="planner_1a2b3c4d" via="peer" principal="acme/planner" message_id="0190...">
    What the peer wrote

    [use `reply_to_peer(peer="planner", message_id="0190...", body=...)` to reply]
    </agent_message>

Like tree mail, the body cannot forge an envelope (``envelope.neutralize``)
and every attribute is written by treemail from the proven event, never by
the sender. The message_id is the reference a reply must name. The reply
hint appears only when the recipient has a route back to that sender with a
send grant: receiving a message grants no way to answer it.
"""

from .envelope import neutralize


def _attribute(value: str) -> str:
    return value.replace("&", "&amp;").replace('"', "&quot;").replace("<", "&lt;").replace(">", "&gt;")


def render_peer_message(sender: str, principal: str, message_id: str, body: str, reply_peer: str | None) -> str:
    lines = [
        f'<agent_message from="{_attribute(sender)}" via="peer" principal="{_attribute(principal)}" '
        f'message_id="{_attribute(message_id)}">',
        neutralize(body),
    ]
    if reply_peer is not None:
        lines += ["", f'[use `reply_to_peer(peer="{reply_peer}", message_id="{message_id}", body=...)` to reply]']
    lines.append("</agent_message>")
    return "\n".join(lines)
