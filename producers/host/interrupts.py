"""``tm.interrupts``: the interrupt_agent tool, the model's call, and the runner's side (read, abort).

An interrupt trigger is written to the interrupted session's partition wake
stream in the same atomic step as its ``SessionInterruptRequested`` event. A
runner that reads one stops that run at its next safe point and reports it
with ``finish_run(..., reason="aborted")`` (``abort_run`` does both and
acknowledges). A trigger no runner acknowledged (it died) is reclaimed by
another after ``reclaim_idle_ms``, as wakes are.
"""

from treemail.domain.commands import InterruptAgent, SendContext
from treemail.domain.errors import Code, LifecycleError
from treemail.domain.triggers import Interrupt
from treemail.services.interrupts import InterruptService
from treemail.services.settlement import SettlementService
from treemail.services.triggers import Triggers

from ..tools import interrupt as interrupt_tool
from ..tools import table
from ..tools.answering import answered

from .shared import Part, Shared

__all__ = ["Interrupt", "Interrupts"]


class Interrupts(Part):
    def __init__(self, shared: Shared, service: InterruptService, triggers: Triggers,
                 settlement: SettlementService) -> None:
        super().__init__(shared)
        self._service = service
        self._triggers = triggers
        self._settlement = settlement

    async def tool_definition(self, session_id: str) -> dict | None:
        """The interrupt_agent tool, or None without an allowing ``interrupt`` rule."""
        return await table.definition(interrupt_tool.TOOL_NAME, await self._views.read(session_id))

    async def interrupt_agent(self, context: SendContext, arguments) -> dict:
        """A model's interrupt_agent call; like send_message it never raises for model input.

        ``{"result": "interrupt_requested", "interrupt_id", "agent", "message"}``; an accepted no-op that
        touches nothing ``{"result": "no_op", "reason", "agent", "message"}`` (``reason``: ``absent``,
        ``settled``, ``one_shot`` or ``not_running``); or ``{"error": {"code", "message"}}``.
        """
        return await answered(
            lambda: self._service.interrupt(InterruptAgent(context, interrupt_tool.parse_arguments(arguments))),
            Code.INTERRUPT_ENGINE_SHUTDOWN,
        )

    async def read(self, consumer: str, count: int = 10, block_ms: int = 1000) -> list[Interrupt]:
        """Interrupt triggers for this runner; those whose run already ended are acknowledged and dropped."""
        return await self._triggers.interrupts(consumer, count, block_ms)

    async def unacknowledged(self, consumer: str, after: dict[str, str] | None = None) -> list[Interrupt]:
        """The triggers this runner read and never acknowledged, past ``after`` (stream -> entry id), as
        ``read`` hands them: a follower that reconnects gets those that never reached it."""
        return await self._triggers.unacknowledged_interrupts(consumer, after)

    async def abort_run(self, interrupt: Interrupt) -> bool:
        """At the run's next safe point: finish it with reason aborted, then acknowledge the trigger.

        False when that run had already ended (nothing to abort); the trigger is acknowledged anyway.
        """
        try:
            await self._settlement.finish(interrupt.session_id, interrupt.run_id, "aborted", None)
            aborted = True
        except LifecycleError as error:
            if error.code != "lifecycle:not_current_run":
                raise
            aborted = False
        await self._triggers.ack_interrupt(interrupt)
        return aborted
