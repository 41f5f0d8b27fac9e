"""Interrupt triggers for host runners: read them like wakes, in a group of their own.

An interrupt trigger is written to the interrupted session's partition wake
stream in the same atomic step as its ``SessionInterruptRequested`` event. A
runner that reads one stops that run at its next safe point and reports it
with ``finish_run(..., reason="aborted")`` (``tm.interrupts.abort_run`` does
both and acknowledges). A trigger no runner acknowledged (it died) is reclaimed
by another after ``reclaim_idle_ms``, as wakes are.
"""

from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from treemail.adapters import keys
from treemail.adapters.config import ServiceConfig
from treemail.adapters.eventstore import EventStore
from treemail.domain.commands import InterruptAgent, SendContext
from treemail.domain.errors import Code, LifecycleError
from treemail.services.interrupts import InterruptService
from treemail.services.sessions import SessionService

from ..tools import interrupt as interrupt_tool
from ..tools.answering import answered

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


def interrupt_trigger(stream: str, entry_id: str, data: dict) -> Interrupt:
    return Interrupt(
        data["session_id"], data["run_id"], data["interrupt_id"], data["sender_session_id"],
        data.get("reason", ""), stream, entry_id,
    )


def interrupt_reader(redis, config: ServiceConfig) -> WakeReader:
    """Interrupt triggers, in their own group created from the start of each stream: an interrupt
    written before any runner read one is still seen."""
    return WakeReader(redis, config, group=keys.INTERRUPT_GROUP, kind="interrupt", trigger=interrupt_trigger,
                      from_start=True)


class Interrupts:
    """``tm.interrupts``: the interrupt_agent tool, the model's call, and the runner's side (read, abort)."""

    def __init__(self, sessions: SessionService, store: EventStore, service: InterruptService, reader: WakeReader,
                 finish_run: Callable[..., Awaitable[str | None]]) -> None:
        self._sessions = sessions
        self._store = store
        self._service = service
        self._reader = reader
        self._finish_run = finish_run

    async def tool_definition(self, session_id: str) -> dict | None:
        """The interrupt_agent tool, or None without an allowing ``interrupt`` rule."""
        return interrupt_tool.tool_definition((await self._sessions.record(session_id)).interrupt_rules)

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
        return await self._live(await self._reader.read(consumer, count, block_ms))

    async def unacknowledged(self, consumer: str, after: dict[str, str] | None = None) -> list[Interrupt]:
        """The triggers this runner read and never acknowledged, past ``after`` (stream -> entry id), as
        ``read`` hands them: a follower that reconnects gets those that never reached it."""
        return await self._live(await self._reader.unacknowledged(consumer, after or {}))

    async def _live(self, triggers: list[Interrupt]) -> list[Interrupt]:
        live = []
        for trigger in triggers:
            record = await self._sessions.record(trigger.session_id)
            if (await self._store.load(record)).state.current_run == trigger.run_id:
                live.append(trigger)
            else:
                await self._reader.ack(trigger)
        return live

    async def abort_run(self, interrupt: Interrupt) -> bool:
        """At the run's next safe point: finish it with reason aborted, then acknowledge the trigger.

        False when that run had already ended (nothing to abort); the trigger is acknowledged anyway.
        """
        try:
            await self._finish_run(interrupt.session_id, interrupt.run_id, reason="aborted")
            aborted = True
        except LifecycleError as error:
            if error.code != "lifecycle:not_current_run":
                raise
            aborted = False
        await self._reader.ack(interrupt)
        return aborted
