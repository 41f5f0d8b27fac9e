"""Wake and interrupt triggers for host runners (``adapters.wakes`` reads them), and what is still live.

An interrupt whose run already ended when a runner reads it is acknowledged
and dropped here: nothing is left to stop.
"""

from ..adapters.wakes import WakeReader
from ..domain import limits
from ..domain.triggers import Interrupt, Wake
from .sessionreader import SessionReader

# A runner reads at most this many triggers at a time.
MAX_TRIGGERS_READ = 1000


def require_read(consumer: str, count: int, block_ms: int) -> None:
    """A runner's read as the streams can take it: its name an identifier (kept in every wake stream's group,
    so bounded), a count from 1 to ``MAX_TRIGGERS_READ``, a wait in whole milliseconds (0: until one comes)."""
    limits.require_id("consumer", consumer)
    if isinstance(count, bool) or not isinstance(count, int) or not 1 <= count <= MAX_TRIGGERS_READ:
        raise limits.invalid(f"count must be a whole number from 1 to {MAX_TRIGGERS_READ}, got {limits.shown(count)}")
    if isinstance(block_ms, bool) or not isinstance(block_ms, int) or block_ms < 0:
        raise limits.invalid(f"block_ms must be a whole number of milliseconds, 0 or more, got {limits.shown(block_ms)}")


def require_after(consumer: str, after: dict[str, str] | None) -> None:
    """A reconnecting runner's position: each stream named with an entry id the server could have written."""
    limits.require_id("consumer", consumer)
    if after is None:
        return
    if not isinstance(after, dict):
        raise limits.invalid("after must map wake streams to the last entry id received from each")
    for stream, entry_id in after.items():
        limits.require_id("after's stream", stream)
        if not limits.is_entry_id(entry_id):
            raise limits.invalid(f"after[{limits.shown(stream)}] is not a stream entry id: {limits.shown(entry_id)}")


class Triggers:
    def __init__(self, wakes: WakeReader, interrupts: WakeReader, reader: SessionReader) -> None:
        self._wakes = wakes
        self._interrupts = interrupts
        self._reader = reader

    async def wakes(self, consumer: str, count: int, block_ms: int) -> list[Wake]:
        require_read(consumer, count, block_ms)
        return await self._wakes.read(consumer, count, block_ms)

    async def ack_wake(self, wake: Wake) -> None:
        await self._wakes.ack(wake)

    async def unacknowledged_wakes(self, consumer: str, after: dict[str, str] | None = None) -> list[Wake]:
        """The wake triggers ``consumer`` read and never acknowledged, past ``after`` (wake stream -> entry id;
        all of a stream it does not name): what a follower that reconnects never received."""
        require_after(consumer, after)
        return await self._wakes.unacknowledged(consumer, after or {})

    async def probe(self) -> None:
        """Returns while wakes can be followed and answered: the server answers and every wake stream has the
        runners' group; raises when the server cannot be reached."""
        await self._wakes.probe()

    async def interrupts(self, consumer: str, count: int, block_ms: int) -> list[Interrupt]:
        """Interrupt triggers for this runner; those whose run already ended are acknowledged and dropped."""
        require_read(consumer, count, block_ms)
        return await self._live(await self._interrupts.read(consumer, count, block_ms))

    async def unacknowledged_interrupts(self, consumer: str, after: dict[str, str] | None = None
                                        ) -> list[Interrupt]:
        """The interrupt triggers ``consumer`` read and never acknowledged, past ``after`` (stream -> entry id),
        as ``interrupts`` hands them: a follower that reconnects gets those that never reached it."""
        require_after(consumer, after)
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
