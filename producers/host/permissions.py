"""``tm.permissions``: who may message whom, and who answers when a rule says ``ask``.

The rules laid over a session's agent-document rules at run time, the
effective report, the sentence a child is told about reaching its parent,
the host's pre-send hooks (``plugins.py``) and the people's side of the
`ask` rule (``services/approvals.py``).
"""

from treemail.domain import limits
from treemail.domain import commands as c
from treemail.domain import effective, notices, permissions
from treemail.domain.commands import SendArguments, SendContext
from treemail.services.approvals import ApprovalService

from . import plugins
from .plugins import SendHook
from .shared import Part, Shared


class Permissions(Part):
    def __init__(self, shared: Shared, approvals: ApprovalService) -> None:
        super().__init__(shared)
        self._approvals = approvals
        self._send_hooks: list[SendHook] = []

    async def set_message_rules(self, session_id: str, rules) -> None:
        """Lay ``rules`` over the session's agent-document rules at run time (None or empty: remove the
        overlay). Recorded as ``MessageRulesOverlaid`` on the session's stream; sends decide on it."""
        normalized = permissions.normalize_rules(rules)
        await self._sessions.execute(c.OverlayMessageRules(session_id, normalized))

    async def effective(self, session_id: str) -> dict:
        """The tool's visibility and, per label (parent, child, sibling, *), its effect, the rule that
        decided it and the sessions it covers (``effective.render_report`` prints it)."""
        record = await self._reader.record(session_id)
        overlay = (await self._reader.state(record)).rules_overlay
        peers = await self._reader.tree_peers(record)
        return effective.report(record, overlay, peers, self._config.messaging.enabled)

    async def return_guidance(self, session_id: str) -> str | None:
        """The sentence to append to a child's first prompt, or None when it cannot message its parent
        (no tool, its effective rules deny its parent, or the routing policy does not reach it)."""
        record = await self._reader.record(session_id)
        if record.parent_session_id is None:
            return None
        parent = await self._reader.find(record.parent_session_id)
        overlay = (await self._reader.state(record)).rules_overlay
        return notices.return_guidance_for(record, parent, overlay, self._config.messaging.routing)

    # ---- the host's pre-send hooks ------------------------------------------------------------------------

    def add_send_hook(self, hook: SendHook):
        """Run ``hook(SendAttempt)`` before every send is decided; it returns None, or a reason to refuse.

        Returns a function that removes the hook.
        """
        self._send_hooks.append(hook)
        return lambda: self._send_hooks.remove(hook) if hook in self._send_hooks else None

    async def gate(self, context: SendContext, arguments: SendArguments) -> dict | None:
        """The hooks' refusal of this send as its result, or None to let it through (also with no hook)."""
        if not self._send_hooks:
            return None
        sender = await self._reader.find(context.session_id)
        if await self._reader.decided(sender, context):
            return None  # a retry: the recorded outcome answers it, whatever the hooks say now
        return await plugins.ask_hooks(self._send_hooks, context, arguments)

    # ---- the `ask` rule: the people's side ------------------------------------------------------------------

    async def pending_approvals(self) -> list[dict]:
        return await self._approvals.pending()

    async def approve(self, request_id: str, scope: str = "once") -> dict:
        if scope not in ("once", "tree"):
            raise limits.invalid(f"scope must be once or tree, got {limits.shown(scope)}")
        decision = "approve_tree" if scope == "tree" else "approve_once"
        return await self._approvals.resolve(request_id, decision)

    async def deny(self, request_id: str) -> dict:
        return await self._approvals.resolve(request_id, "deny")
