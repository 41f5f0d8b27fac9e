"""Interrupt triggers for host runners (seed 002 part 2): read them like wakes, in a group of their own.

An interrupt trigger is written to the interrupted session's partition wake
stream in the same atomic step as its ``SessionInterruptRequested`` event. A
runner that reads one stops that run at its next safe point and reports it
with ``finish_run(..., reason="aborted")`` (``Treemail.abort_run`` does both
and acknowledges). A trigger no runner acknowledged (it died) is reclaimed
by another after ``reclaim_idle_ms``, as wakes are.
"""

from dataclasses import dataclass

from redis.exceptions import ResponseError

from treemail.adapters import keys
from treemail.domain.commands import InterruptAgent, SendContext
from treemail.domain.errors import Code, LifecycleError
from treemail.services.interrupts import InterruptService

from treemail.producers.tools import interrupt as interrupt_tool
from treemail.producers.tools.answering import answered

from .wakes import WakeReader


@dataclass(frozen=True)
class Interrupt:
    """Stop ``run_id`` of this session at its next safe point, then finish it aborted and ack."""

    session_id: str
    run_id: str
    interrupt_id: str
    sender_session_id: str
    reason: str
    stream: str
    entry_id: str


class InterruptReader(WakeReader):
    group = keys.INTERRUPT_GROUP
    kind = "interrupt"

    def __init__(self, redis, config) -> None:
        super().__init__(redis, config)
        self._groups_ready = False

    async def read(self, consumer: str, count: int, block_ms: int) -> list[Interrupt]:
        if not self._groups_ready:
            await self._ensure_groups()
        return await super().read(consumer, count, block_ms)

    async def _ensure_groups(self) -> None:
        # From the start of each stream: an interrupt written before any runner read one is still seen.
        for stream in self.streams():
            try:
                await self.redis.xgroup_create(stream, self.group, id="0", mkstream=True)
            except ResponseError as exc:
                if "BUSYGROUP" not in str(exc):
                    raise
        self._groups_ready = True

    @staticmethod
    def _trigger(stream: str, entry_id: str, data: dict) -> Interrupt:
        return Interrupt(
            data["session_id"], data["run_id"], data["interrupt_id"], data["sender_session_id"],
            data.get("reason", ""), stream, entry_id,
        )


class InterruptHost:
    """The host API of interrupt_agent, mixed into ``Treemail``: the tool, the call, the runner's side."""

    def _init_interrupts(self) -> None:
        self.interrupt_reader = InterruptReader(self.redis, self.config.service)
        self.interrupt_service = InterruptService(self.store)

    async def interrupt_tool_definition(self, session_id: str) -> dict | None:
        """The interrupt_agent tool, or None without an allowing ``interrupt`` rule."""
        return interrupt_tool.tool_definition((await self.sessions.record(session_id)).interrupt_rules)

    async def interrupt_agent(self, context: SendContext, arguments) -> dict:
        """A model's interrupt_agent call; like send_message it never raises for model input.

        ``{"result": "interrupt_requested", "interrupt_id", "agent", "message"}``, or for a target
        with no run open ``{"result": "not_running", ...}``, or ``{"error": {"code", "message"}}``.
        """
        return await answered(
            lambda: self.interrupt_service.interrupt(InterruptAgent(context, interrupt_tool.parse_arguments(arguments))),
            Code.INTERRUPT_ENGINE_SHUTDOWN,
        )

    async def interrupts(self, consumer: str, count: int = 10, block_ms: int = 1000) -> list[Interrupt]:
        """Interrupt triggers for this runner; those whose run already ended are acknowledged and dropped."""
        live = []
        for trigger in await self.interrupt_reader.read(consumer, count, block_ms):
            record = await self.sessions.record(trigger.session_id)
            if (await self.store.load(record)).state.current_run == trigger.run_id:
                live.append(trigger)
            else:
                await self.interrupt_reader.ack(trigger)
        return live

    async def abort_run(self, interrupt: Interrupt) -> bool:
        """At the run's next safe point: finish it with reason aborted, then acknowledge the trigger.

        False when that run had already ended (nothing to abort); the trigger is acknowledged anyway.
        """
        try:
            await self.finish_run(interrupt.session_id, interrupt.run_id, reason="aborted")
            aborted = True
        except LifecycleError as error:
            if error.code != "lifecycle:not_current_run":
                raise
            aborted = False
        await self.interrupt_reader.ack(interrupt)
        return aborted
