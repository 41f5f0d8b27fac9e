"""Deciding a batch on the states the worker already holds, without reading them again.

A worker that appended to a session holds the state its append left
(``EventStore.held``); most batches decide the same sessions as the batch
before. Such a batch is decided on held states, and a decision is kept only
if every state it read is checked by its own append: the recipient's (the
append is on its stream) and the sender's (its record rides along). The commit
step refuses an append whose etag is no longer the server's, and the command
is then decided again on states read afresh. Any other decision (a refusal
kept alone, a replayed call, an approval request) sends the whole batch round
again with a fresh read. The other reads are those of the last fresh read:
the service-wide drain flag (the commit step checks it against the
partition's copy: a drain that began since is a conflict), and the tree
grants (they only ever widen: one granted since reads as an approval still to
ask for, which is not kept, so the batch is read afresh). Held reads are
refreshed at least every ``WINDOW_S`` all the same.
"""

from ..adapters.eventstore import EventStore, SendReads
from ..domain.records import SessionRecord
from .clock import SYSTEM_CLOCK, Clock

WINDOW_S = 1.0
# Held states other workers keep changing (they decide the same senders) are not worth deciding on:
# after a batch decided on held states in which more than this share of the appends conflicted, the
# next PAUSE_BATCHES batches are read afresh, and then held states are tried again.
CONTENDED_SHARE = 0.1
PAUSE_BATCHES = 50
# Trees whose grants are kept between fresh reads; past it the oldest are forgotten (read again).
MAX_TREES = 10_000


class HeldReads:
    def __init__(self, store: EventStore, clock: Clock = SYSTEM_CLOCK) -> None:
        self.store = store
        self.clock = clock
        self._read_at = float("-inf")
        self._grants: dict[str, frozenset[str]] = {}
        self._draining = False
        self._paused = 0

    def remember(self, reads: SendReads) -> None:
        """A fresh read: its grants and drain flag are used for the next ``WINDOW_S``."""
        self._read_at = self.clock.monotonic()
        self._grants.update(reads.tree_grants)
        while len(self._grants) > MAX_TREES:
            del self._grants[next(iter(self._grants))]
        self._draining = reads.service_draining

    def contended(self, conflicted: int, appended: int) -> None:
        """After a batch decided on held states: how many of its appends found another writer first."""
        if conflicted > CONTENDED_SHARE * appended:
            self._paused = PAUSE_BATCHES

    @property
    def paused(self) -> bool:
        """Whether other writers have lately been changing the states held (``contended``)."""
        return self._paused > 0

    def reads(self, records: list[SessionRecord], senders: list[SessionRecord]) -> SendReads | None:
        """What a fresh read would return, from what is held; None if anything is not held or too old, or
        while held states are paused (``contended``)."""
        if self._paused:
            self._paused -= 1
            return None
        if self.clock.monotonic() - self._read_at > WINDOW_S:
            return None
        loaded = {}
        for record in records:
            held = self.store.held(record.session_id)
            if held is None:
                return None
            loaded[record.session_id] = held
        grants = {}
        for sender in senders:
            labels = self._grants.get(sender.root_session_id)
            if labels is None:
                return None
            grants[sender.root_session_id] = labels
        return SendReads(loaded, {}, grants, self._draining)
