"""Session states this process already holds, each under the etag of the append that wrote it.

A worker decides the same sessions batch after batch: parsing each one's
snapshot JSON again was a tenth of its CPU (BENCHMARKS.md, issue 17). The
etag is unique to one append, so the state stored under an etag never
changes: a state held here is used only when the server's state hash still
carries the same etag (read in the same round trip as before), so nothing is
trusted that the server did not confirm, and any number of workers may race.
"""

from ..domain.state import SessionState

DEFAULT_LIMIT = 10_000


class StateCache:
    def __init__(self, limit: int = DEFAULT_LIMIT) -> None:
        self.limit = limit
        self._states: dict[str, tuple[str, int, SessionState]] = {}

    def get(self, session_id: str, etag: str) -> SessionState | None:
        held = self._states.get(session_id)
        return held[2] if held is not None and held[0] == etag and etag else None

    def latest(self, session_id: str) -> tuple[str, int, SessionState] | None:
        """(etag, version, state) last held for the session: what the server showed or this process last
        wrote, which another writer may have superseded (only an append checked against the etag may use it)."""
        held = self._states.get(session_id)
        return held if held is not None and held[0] else None

    def put(self, session_id: str, etag: str, state: SessionState, version: int) -> None:
        """Kept until the next append of the session replaces it; the oldest session goes past ``limit``."""
        self._states.pop(session_id, None)
        self._states[session_id] = (etag, version, state)
        if len(self._states) > self.limit:
            del self._states[next(iter(self._states))]

    def __len__(self) -> int:
        return len(self._states)
