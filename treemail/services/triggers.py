"""Wake and interrupt triggers for host runners (``adapters.wakes`` reads them), and what is still live.

An interrupt whose run already ended when a runner reads it is acknowledged
and dropped here: nothing is left to stop.
"""

from ..adapters.wakes import WakeReader
from ..domain.triggers import Interrupt, Wake
from .sessionreader import SessionReader


class Triggers:
    def __init__(self, wakes: WakeReader, interrupts: WakeReader, reader: SessionReader) -> None:
        self._wakes = wakes
        self._interrupts = interrupts
        self._reader = reader

    async def wakes(self, consumer: str, count: int, block_ms: int) -> list[Wake]:
        return await self._wakes.read(consumer, count, block_ms)

    async def ack_wake(self, wake: Wake) -> None:
        await self._wakes.ack(wake)

    async def unacknowledged_wakes(self, consumer: str, after: dict[str, str] | None = None) -> list[Wake]:
        """The wake triggers ``consumer`` read and never acknowledged, past ``after`` (wake stream -> entry id;
        all of a stream it does not name): what a follower that reconnects never received."""
        return await self._wakes.unacknowledged(consumer, after or {})

    async def probe(self) -> None:
        """Returns while wakes can be followed and answered: the server answers and every wake stream has the
        runners' group; raises when the server cannot be reached."""
        await self._wakes.probe()

    async def interrupts(self, consumer: str, count: int, block_ms: int) -> list[Interrupt]:
        """Interrupt triggers for this runner; those whose run already ended are acknowledged and dropped."""
        return await self._live(await self._interrupts.read(consumer, count, block_ms))

    async def unacknowledged_interrupts(self, consumer: str, after: dict[str, str] | None = None
                                        ) -> list[Interrupt]:
        """The interrupt triggers ``consumer`` read and never acknowledged, past ``after`` (stream -> entry id),
        as ``interrupts`` hands them: a follower that reconnects gets those that never reached it."""
        return await self._live(await self._interrupts.unacknowledged(consumer, after or {}))

    async def _live(self, triggers: list[Interrupt]) -> list[Interrupt]:
        live = []
        for trigger in triggers:
            if (await self._reader.state_of(trigger.session_id)).current_run == trigger.run_id:
                live.append(trigger)
            else:
                await self._interrupts.ack(trigger)
        return live

    async def ack_interrupt(self, interrupt: Interrupt) -> None:
        await self._interrupts.ack(interrupt)
