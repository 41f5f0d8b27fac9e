"""Session states this process already holds, each under the etag of the append that wrote it.

A worker decides the same sessions batch after batch: parsing each one's
snapshot JSON again was a tenth of its CPU (BENCHMARKS.md). The
etag is unique to one append, so the state stored under an etag never
changes: a state held here is used only when the server's state hash still
carries the same etag (read in the same round trip as before), so nothing is
trusted that the server did not confirm, and any number of workers may race.
"""

from typing import NamedTuple

from ..domain.state import SessionState

DEFAULT_LIMIT = 10_000


class Loaded(NamedTuple):
    """A session's state as read or left by an append (a tuple: built several times per decision)."""

    state: SessionState
    version: int
    # Unique to the append that produced this state; what the next append must find.
    etag: str = ""


class StateCache:
    def __init__(self, limit: int = DEFAULT_LIMIT) -> None:
        self.limit = limit
        self._held: dict[str, Loaded] = {}

    def get(self, session_id: str, etag: str) -> SessionState | None:
        held = self._held.get(session_id)
        return held.state if held is not None and held.etag == etag and etag else None

    def latest(self, session_id: str) -> Loaded | None:
        """What was last held for the session: what the server showed or this process last wrote, which
        another writer may have superseded (only an append checked against the etag may use it)."""
        held = self._held.get(session_id)
        return held if held is not None and held.etag else None

    def put(self, session_id: str, loaded: Loaded) -> None:
        """Kept until the next append of the session replaces it; the oldest session goes past ``limit``."""
        self._held.pop(session_id, None)
        self._held[session_id] = loaded
        if len(self._held) > self.limit:
            del self._held[next(iter(self._held))]

    def __len__(self) -> int:
        return len(self._held)
