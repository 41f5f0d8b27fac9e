"""Decision spans for tracing: one span per send a worker decides (``treemail.admit``), child of the host's
preparation span.

A span starts when the batch is read and ends once its decision is durable,
so it covers the decision and the commit. Nothing is created when tracing
is off.
"""

from treemail.adapters import tracing
from treemail.domain.commands import SendMessage


def start(commands: list[SendMessage]) -> list | None:
    if not tracing.enabled():
        return None
    return [tracing.start("treemail.admit", command.traceparent or None, command_id=command.command_id,
                          sender_session_id=command.context.session_id) for command in commands]


def end(spans: list | None, commands: list[SendMessage], outcomes: dict[str, dict]) -> None:
    for span, command in zip(spans or (), commands):
        outcome = outcomes.get(command.command_id, {})
        ok = outcome.get("ok") or {}
        error = outcome.get("error") or {}
        span.set_attribute("treemail.outcome", "ok" if ok else error.get("code", "approval_pending"))
        message_id = ok.get("message_id") or error.get("message_id")
        if message_id:
            span.set_attribute("treemail.message_id", message_id)
        span.end()
