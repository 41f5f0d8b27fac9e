"""Notices: what treemail itself tells an agent. Pure.

Two kinds, each its own producer owner so that no transcript can credit an
agent with words it never wrote, and neither ever counts against the agent
guards:

- ``settlement``: a child's run ended for good, or it was disposed. A
  summary line for the stop reason, then the child's closing message (its text
  blocks in order, byte-exact, or "It left no closing message."). Delivered to
  the parent, naming the child's session as its subject (``sender_session_id``)
  under the settlement owner, so it is never taken for the child's own words.
- ``returned``: a message accepted before its recipient's disposal cutoff that
  the recipient never processed, handed back to its sender with the reason.
- ``loop``: two sessions were stopped answering each other with no new
  content; told once to their nearest common ancestor (``loops.py``).

Rendered as ``<treemail_notice kind="...">``, never as ``<agent_message>``:

    <treemail_notice kind="subagent_settled">
    Background subagent explore_1a2b3c4d finished and will do no further work unless you send it more.

    It left no closing message.
    </treemail_notice>
"""

from collections.abc import Iterable

from . import effective, envelope, limits, neighbours
from .records import SessionRecord
from .state import SessionState

NOTICE_KINDS = {"settlement": "subagent_settled", "returned": "message_returned", "loop": "loop_stopped"}

# How the child's run ended, per stop reason: what a parent reads first. A finished child's line says
# what it will do next; every other says only how it ended, so a parent never reads a failure as a finish.
_ENDED = {
    "completed": "finished",
    "aborted": "was stopped before it finished",
    "max_tokens": "ran out of room before it finished",
    "refusal": "declined the task",
    # A delivery a pre-step policy of the host rejected: the child declined it, as far as its parent can tell.
    "policy_rejected": "declined the task",
    "error": "failed before it finished",
}
FINISHED_TAIL = "will do no further work unless you send it more"
NO_CLOSING_TEXT = "It left no closing message."
# Closing message blocks are joined by a blank line, each kept byte for byte.
BLOCK_SEPARATOR = "\n\n"


def ended(stop_reason: str) -> str:
    """Any other stop reason a host reports ends abnormally, with its reason (the host's word, bounded): never
    refused, never dressed up as one of the known ends."""
    return _ENDED.get(stop_reason) or f"ended abnormally (reason: {stop_reason})"


def summary_line(handle: str, stop_reason: str, disposed: bool = False, session_id: str | None = None,
                 resumable: bool = False) -> str:
    how = ended(stop_reason)
    # The handle is what the parent addresses; the session id is what a host's logs and tools show.
    who = f"{handle} (session {session_id})" if session_id and session_id != handle else handle
    if disposed and resumable:
        # A continuable child is resumed by the next message sent to it (cold resume).
        return (f"Background subagent {who} {how} and was disposed: it will do no further work unless you "
                "send it more, which starts it again.")
    if disposed:
        # A disposed session is never resumed (no cold resume after disposal): mail to it is refused.
        return (
            f"Background subagent {who} {how} and was disposed: it will do no further work "
            "and cannot receive messages."
        )
    if stop_reason == "completed":
        return f"Background subagent {who} {how} and {FINISHED_TAIL}."
    return f"Background subagent {who} {how}."


def closing_message(closing) -> str | None:
    """The child's closing message as its parent reads it, from what the host gave: a string (one text block)
    or the content blocks of the child's last message, whose text blocks are kept in order and byte for byte
    (reasoning, tool calls and any other block left out). None when nothing readable is left: an empty
    string, no text blocks, or only blank text reads as no closing message, never as an error.
    Raises ``IdentifierError`` (a ValueError) for a block list that is not one (a block that is not an object,
    a text that is not text)."""
    if closing is None:
        return None
    if isinstance(closing, str):
        texts = [closing]
    elif isinstance(closing, (list, tuple)):
        texts = []
        for block in closing:
            if not isinstance(block, dict):
                raise limits.invalid("closing message blocks must be objects like {\"type\": \"text\", \"text\": ...}")
            if block.get("type") == "text":
                if not isinstance(block.get("text"), str):
                    raise limits.invalid("a closing message text block's `text` must be a string")
                texts.append(block["text"])
    else:
        raise limits.invalid("the closing message is a string or a list of content blocks")
    texts = [text for text in texts if text.strip()]
    return BLOCK_SEPARATOR.join(texts) if texts else None


def settlement_text(handle: str, stop_reason: str, closing_text: str | None, disposed: bool = False,
                    session_id: str | None = None, resumable: bool = False) -> str:
    """The summary line, then the child's closing message (its last words, as the host gave them, byte-exact)."""
    closing = closing_text if closing_text and closing_text.strip() else NO_CLOSING_TEXT
    return f"{summary_line(handle, stop_reason, disposed, session_id, resumable)}\n\n{closing}"


def returned_text(recipient_handle: str, body: str, stop_reason: str | None) -> str:
    why = f" ({stop_reason})" if stop_reason else ""
    return (
        f"Your message to {recipient_handle} was not delivered: {recipient_handle} was disposed{why} before it "
        f"processed the message, and it cannot receive messages any more. Your message was:\n\n{body}"
    )


def peer_refused_text(peer: str, message_id: str, code: str) -> str:
    return (f"Your message {message_id} to {peer} was not delivered: its destination refused it ({code}). It will "
            "not be delivered; send a new message if it still matters.")


def render_notice(owner: str, body: str) -> str:
    """The prompt text of a notice; a closing text or a returned body cannot close the notice or forge one."""
    return f'<treemail_notice kind="{NOTICE_KINDS[owner]}">\n{envelope.neutralize(body)}\n</treemail_notice>'


def notice_delivery(state: SessionState | None) -> str:
    """How a notice reaches a session: its gates, in order.

    ``unavailable`` (not registered, disposed, or finished and never to run
    again: nothing is written), ``injected`` (being disposed: written to its
    stream directly, never claimed), ``steered`` (busy: joins the running turn),
    ``queued`` (idle: a new turn, woken if need be).
    """
    if state is None or not state.registered or state.disposal == "closed":
        return "unavailable"
    if state.status == "finished" and not state.continuable:
        return "unavailable"
    if state.disposal == "closing":
        return "injected"
    return "steered" if state.current_run is not None else "queued"


def return_guidance(parent_handle: str) -> str:
    """The return guidance for a child's first prompt, in treemail's arguments."""
    return (
        f"Your parent agent is {parent_handle}. Before you finish, send your result to that agent with "
        f'send_message(to="{parent_handle}", body="<self-contained result>"). The parent shares your workspace '
        "but does not automatically receive your transcript, tool output, or reasoning. Send earlier messages "
        "as well when a finding changes what the parent should do next; sending a message does not end your turn."
    )


def return_guidance_for(
    child: SessionRecord, parent: SessionRecord | None, overlay: Iterable[tuple[str, str]] = (),
    routing_policy: str = "tree",
) -> str | None:
    """Only for a child that can see send_message and may use it on its parent (its effective rules under
    the host's overlay, and the routing policy): teaching a tool the model does not have would make it
    invent one."""
    overlay = tuple(overlay)
    if parent is None or not effective.tool_visible(child, overlay):
        return None
    if effective.effect(child.rules, overlay, "parent") == "deny":
        return None
    if not neighbours.may_address(routing_policy, child, parent):
        return None
    return return_guidance(parent.address)
