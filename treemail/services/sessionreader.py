"""Every read the host's parts make of a session: its record, its state, its mail, its history.

The parts on the top floor never hold the event store or a server client;
they ask here. Each read is the store's own (the same round trips as before):
this service only gives them one address, and keeps the few reads that judge
what they read (a claimed entry a newer protocol wrote, a tool call decided
already) beside the others.
"""

import functools
import time

from ..adapters import directory, keys
from ..adapters.compact import record_fields
from ..adapters.eventstore import EventStore, Loaded, decode_entry
from ..domain import events as ev
from ..domain import limits, protocol
from ..domain.commands import SendContext
from ..domain.decide import idempotency
from ..domain.errors import UnknownSessionError
from ..domain.records import Peer, SessionRecord
from ..domain.state import MailItem, SessionState
from .tracecause import cause_traceparent

# A claimed entry a newer protocol wrote (``accepted_at``): neither judged nor delivered by this version.
NEWER = object()
# A blocking read stays under the connection's per-reply timeout (``connection.REPLY_TIMEOUT_S``, 5 s):
# a longer wait is a few blocking reads in a row, each woken at once by an append.
BLOCK_SLICE_S = 4.0


class SessionReader:
    """``listener``: the connection a blocking read waits on (``wait_for_change``), apart from the store's."""

    def __init__(self, store: EventStore, listener=None) -> None:
        self._store = store
        self._directory = store.directory
        self._listener = listener
        # The traceparent a send from a run continues (``tracecause``), bound here without a frame of its own:
        # every send asks.
        self.cause_traceparent = functools.partial(cause_traceparent, store)

    # ---- records ------------------------------------------------------------------------------------

    async def record(self, session_id: str) -> SessionRecord:
        """The session's record; ``UnknownSessionError`` for a session treemail does not know."""
        limits.require_id("session_id", session_id)  # never looked up (nor echoed) whatever its size
        record = await self._directory.get(session_id)
        if record is None:
            raise UnknownSessionError(f"no session has id {session_id}")
        return record

    async def find(self, session_id: str) -> SessionRecord | None:
        """The session's record, None for one treemail does not know."""
        return await self._directory.get(session_id)

    async def many(self, session_ids: list[str]) -> dict[str, SessionRecord | None]:
        return await self._directory.many(session_ids)

    async def tree(self, record: SessionRecord) -> list[SessionRecord]:
        """Every session of ``record``'s tree the tree index knows now."""
        members = await self._directory.tree_members(record.partition, record.root_session_id)
        return [r for r in (await self._directory.many(members)).values() if r is not None]

    async def tree_peers(self, record: SessionRecord) -> list[Peer]:
        return await self._directory.tree_peers(record)

    async def partition_sessions(self, partition: int) -> list[str]:
        """Every session registered in the partition, sorted."""
        return await directory.registered(self._store.redis, partition)

    # ---- state ----------------------------------------------------------------------------------------

    async def loaded(self, record: SessionRecord) -> Loaded:
        return await self._store.load(record)

    async def state(self, record: SessionRecord) -> SessionState:
        return (await self._store.load(record)).state

    async def state_of(self, session_id: str) -> SessionState:
        """The state of a session by id; ``UnknownSessionError`` for an unknown one."""
        return (await self._store.load(await self.record(session_id))).state

    async def version(self, session_id: str) -> int:
        """The session's current stream position."""
        return (await self._store.load(await self.record(session_id))).version

    async def current_run(self, session_id: str) -> str | None:
        """The session's open run, None when none is (also for a session treemail does not know)."""
        record = await self._directory.get(session_id)
        return (await self._store.load(record)).state.current_run if record is not None else None

    def parse_state(self, record: SessionRecord, values: list) -> SessionState:
        """The state read with another reply in one round trip (``state_read``)."""
        return self._store.parse_loaded(record.session_id, values).state

    def state_read(self, record: SessionRecord, batch) -> None:
        """Adds the read of the session's state to ``batch`` (its reply: ``parse_state``)."""
        batch.hmget(self._store.state_key(record), *self._store.STATE_FIELDS)

    async def read_round_trip(self, build) -> list:
        return await self._store.read_round_trip(build)

    # ---- mail and history -------------------------------------------------------------------------------

    async def mail(self, record: SessionRecord) -> dict[str, MailItem]:
        """All of the session's pending mail."""
        return await self._store.load_mail(record)

    async def mail_items(self, record: SessionRecord, message_ids: list[str]) -> dict[str, MailItem]:
        return await self._store.load_mail_items(record, message_ids)

    async def history(self, record: SessionRecord, after: int = 0, count: int | None = None
                      ) -> list[tuple[int, ev.Event]]:
        return await self._store.read(record, after, count)

    async def read_at(self, record: SessionRecord, positions: list[int]) -> dict[int, ev.Event]:
        return await self._store.read_at(record, positions)

    async def accepted_at(self, record: SessionRecord, seqs: list[int]) -> dict[int, ev.Event | None]:
        """The accepted events at these positions, read tolerantly: None where an entry is gone or no
        longer reads as an event, ``NEWER`` where a newer protocol wrote it."""
        found: dict[int, ev.Event | None] = {}
        for seq, entries in zip(seqs, await self._store.entries_at(record, seqs)):
            try:
                [(_, fields)] = entries
                if protocol.is_newer(protocol.version_of(fields.get(b"v"))):
                    # A newer treemail wrote it: not this version's to judge; it stays claimed, undelivered.
                    found[seq] = NEWER
                    continue
                event = decode_entry(fields)
            except (ValueError, KeyError, UnicodeDecodeError):
                event = None
            found[seq] = event if isinstance(event, ev.ProducerMessageAccepted) else None
        return found

    async def decided(self, sender: SessionRecord | None, context: SendContext) -> bool:
        """Whether this tool call has a decision recorded under its idempotency key (a retry)."""
        if sender is None:
            return False
        # Sends never leave a tree, so the record lives in the sender's partition.
        key = keys.session_idempotency(sender.partition, sender.session_id)
        digest = idempotency.key_digest(context)
        return any(raw is not None for raw in await self._store.redis.hmget(key, *record_fields(digest)))

    async def wait_for_change(self, record: SessionRecord, after: int, timeout_s: float) -> bool:
        """Block until the session's stream holds an event past position ``after`` (True), or ``timeout_s``
        passes (False)."""
        stream = keys.session_stream(record.partition, record.session_id)
        deadline = time.monotonic() + max(0.0, timeout_s)
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            block_ms = max(1, int(min(left, BLOCK_SLICE_S) * 1000))
            if await self._listener.xread({stream: f"{after}-0"}, count=1, block=block_ms):
                return True
