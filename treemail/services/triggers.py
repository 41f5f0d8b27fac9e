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

    async def interrupts(self, consumer: str, count: int, block_ms: int) -> list[Interrupt]:
        """Interrupt triggers for this runner; those whose run already ended are acknowledged and dropped."""
        live = []
        for trigger in await self._interrupts.read(consumer, count, block_ms):
            if (await self._reader.state_of(trigger.session_id)).current_run == trigger.run_id:
                live.append(trigger)
            else:
                await self._interrupts.ack(trigger)
        return live

    async def ack_interrupt(self, interrupt: Interrupt) -> None:
        await self._interrupts.ack(interrupt)
