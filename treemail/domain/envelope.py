"""The envelope a recipient's model sees. Pure.

    <agent_message from="explore_1a2b3c4d">
    Message written by the sending agent

    [use `send_message(to="explore_1a2b3c4d", ...)` to reply]
    </agent_message>

The body is kept as written, with one exception that makes forgery
impossible: wherever the body holds something that reads as an envelope tag
(``<agent_message`` or ``</agent_message``, in any case, with any spacing after
the ``<``), that ``<`` is written as ``&lt;``. So the only tags in the text are
the ones treemail wrote, and ``from`` always names the real sender. The
durable event keeps the body byte for byte.
"""

import re

# treemail_notice too: a body must not be able to forge a notice treemail writes (seed 002) either.
TAG = re.compile(r"<(\s*/?\s*(?:agent_message|treemail_notice))", re.IGNORECASE)


def neutralize(body: str) -> str:
    return TAG.sub(r"&lt;\1", body)


def render_agent_message(sender: str, body: str, reply_hint: bool) -> str:
    """``sender`` is the handle, or the UUID of a sender registered without one."""
    lines = [f'<agent_message from="{sender}">', neutralize(body)]
    if reply_hint:
        lines += ["", f'[use `send_message(to="{sender}", ...)` to reply]']
    lines.append("</agent_message>")
    return "\n".join(lines)
