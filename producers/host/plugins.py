"""Pre-send hooks: host code that gates or audits a send before treemail decides it.

Plugins gate or audit sends before the call runs
(``tool_before_call``). A hook is a function of the attempted send (sync or
async) returning None to let it through, or the reason to refuse it: the
model is answered ``send_message:plugin_refused`` with that reason. Hooks run
in the host process, in the order they were added, after the strict argument
check and before anything is published, so a refused send leaves no trace
(no command, no event, no idempotency record).

A retried tool call gets its original outcome: when the call already has a
decision recorded under its idempotency key, the hooks are not asked again,
so a hook that changed its mind cannot turn a delivered message into a
refusal. A refused call has nothing recorded, so its retry asks the hooks
again (and is sent if they now let it through).
"""

import inspect
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from treemail.domain.commands import SendArguments, SendContext
from treemail.domain.errors import Code
from treemail.domain.results import error_result

log = logging.getLogger("treemail.plugins")


@dataclass(frozen=True)
class SendAttempt:
    """What a hook sees: who sends (from the host's context) and the model's strict arguments."""

    context: SendContext
    to: str
    body: str
    mode: str


SendHook = Callable[[SendAttempt], "str | None | Awaitable[str | None]"]


def refused(reason: str) -> dict:
    return error_result(Code.PLUGIN_REFUSED.value, reason)


async def ask_hooks(hooks: list[SendHook], context: SendContext, arguments: SendArguments) -> dict | None:
    """The first refusal among the hooks, as the tool result; None when every hook lets the send through.

    A hook that raises refuses (fails closed): an audit that could not run must not wave mail through.
    """
    attempt = SendAttempt(context, arguments.to, arguments.body, arguments.mode)
    for hook in list(hooks):
        try:
            verdict = hook(attempt)
            if inspect.isawaitable(verdict):
                verdict = await verdict
        except Exception as exc:  # noqa: BLE001 - a failing plugin refuses, it never breaks the send path
            log.warning("send hook %r failed", hook, exc_info=True)
            return refused(f"a send hook failed ({type(exc).__name__}); the message was not sent")
        if verdict is not None:
            return refused(str(verdict) or "refused by a send hook")
    return None
