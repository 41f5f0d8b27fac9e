"""The event store: read and append session streams on Redis/Valkey.

The one place that knows the commit script and the key layout of a session.
An append is one atomic script call: etag check, events, and what the
domain's commit plan says they leave (``commitplan.plan_commit``: snapshot,
pending mail, wake triggers, indexes, due times, the senders' records), plus
the idempotency record, all on one hash slot. The store lays the plan out as
the script's arguments; it decides nothing.

Over the house's 200 lines: the script's argument layout (``prepare``) must
sit beside the reads of the same keys, so the two cannot drift apart.
"""

import functools
import os
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from importlib import resources
from typing import Any

from redis.asyncio import Redis
from redis.commands.core import AsyncScript
from redis.exceptions import NoScriptError, ResponseError

from ..domain.protocol import PROTOCOL_VERSION
from ..domain import compactjson
from ..domain import events as ev
from ..domain import protocol
from ..domain.commitplan import CommitPlan, SourceWrite
from ..domain.records import SessionRecord
from ..domain.state import Applied, MailItem, SessionState
from . import keys
from .commitargs import CompanionSections, Sections, lay_out
from .config import ServiceConfig
from .compact import (decode_item, decode_record, encode_item, encode_outbound, encode_record, id_bytes,
                      kept_record, record_field, record_fields)
from .directory import Directory
from .lanes import CommandBatch, Lanes, raise_refused
from .replication import require_confirmed, run_waited, wait_command
from .statecache import Loaded, StateCache

COMMIT_LUA = resources.files(__package__).joinpath("commit.lua").read_text()


@functools.lru_cache(maxsize=4096)
def _commit_keys(partition: int, session_id: str, root_session_id: str) -> tuple[str, ...]:
    """The commit script's KEYS 1-14 for one session (commit.lua): the same for every append of the session,
    so built once. KEYS[4] is the tool call's idempotency hash when the append keeps a record (``prepare``
    puts it there); without one it is a placeholder in the same slot, the state hash."""
    p, sid, root = partition, session_id, root_session_id
    return (
        keys.session_stream(p, sid), keys.session_snapshot(p, sid), keys.session_mail(p, sid),
        keys.session_snapshot(p, sid), keys.tree_handles(p, root), keys.tree_members(p, root),
        keys.wake_stream(p), keys.partition_sessions(p), keys.feed(p), keys.approvals(p), keys.tree_grants(p, root),
        keys.session_due(p, sid), keys.due_index(p), keys.outbound_index(p),
    )


# What an older version wrote in the due hash: the item's id alone, its only copy in the pending-mail hash.
_NAMED_ONLY = b"1"


def _mail_items(pairs) -> dict[str, MailItem]:
    """(message id, item) pairs as the server answers them (bytes) -> the items by message id."""
    items = {}
    for raw_id, raw_item in pairs:
        message_id = raw_id.decode()
        items[message_id] = decode_item(message_id, raw_item)
    return items


@dataclass(frozen=True)
class Reply:
    """What an append also does once it applies (``EventStore.answers_in_commit``): push the producer's
    answer to its reply list and acknowledge the command's entry, in the same atomic step."""

    reply_list: str
    answer: str
    stream: str
    entry_id: str | bytes


@dataclass(frozen=True)
class PreparedAppend:
    keys: list[str]
    args: list[Any]
    plan: CommitPlan
    # The state this append leaves, for deciding the next command in the same pipeline.
    loaded: Loaded
    # session id -> the state each source (a sender whose records ride along) is left in, for chaining.
    sources: dict[str, Loaded] = field(default_factory=dict)
    # Whether the append, once it applies, also answers its command and acknowledges its entry (``Reply``).
    answers: bool = False


@dataclass(frozen=True)
class SendReads:
    loaded: dict[str, Loaded]
    # (sender session id, tool call digest) -> its idempotency record, or None.
    recorded: dict[tuple[str, str], list | dict | None]
    # root session id -> labels a person approved for that whole tree.
    tree_grants: dict[str, frozenset[str]]
    # Whether the whole service drains (the service-wide drain flag).
    service_draining: bool


@dataclass(frozen=True)
class AppendResult:
    status: str  # "ok", "dup", "conflict", "handle_taken"
    version: int = 0
    record: list | dict | None = None


def wake_trigger(record: SessionRecord, message_id: str | None, seq: int) -> str:
    return compactjson.dumps(
        {"session_id": record.session_id, "root_session_id": record.root_session_id,
         "message_id": message_id, "seq": seq}
    )


def interrupt_trigger(record: SessionRecord, event: ev.SessionInterruptRequested, seq: int) -> str:
    """An interrupt rides the partition's wake stream, marked by ``kind``: the Lua step stays as it is."""
    return compactjson.dumps(
        {"kind": "interrupt", "session_id": record.session_id, "root_session_id": record.root_session_id,
         "run_id": event.run_id, "interrupt_id": event.interrupt_id, "sender_session_id": event.sender_session_id,
         "reason": event.reason, "seq": seq}
    )


def approval_index(record: SessionRecord, applied: Applied) -> list[str]:
    """(field, value) pairs of the partition's approvals hash this append writes."""
    pairs: list[str] = []
    for request_id, (request, status) in applied.approvals.items():
        if request is not None:
            data = request.model_dump(exclude={"key", "fingerprint"})
            data.update(partition=record.partition, root_session_id=record.root_session_id)
            pairs.extend((request_id, compactjson.dumps(data)))
        pairs.extend((f"{request_id}:status", status))
    return pairs


# The commit script's registration section for a registration without a handle; never a handle (ids.HANDLE_PATTERN).
NO_HANDLE = "*"


def registration_arg(applied: Applied) -> str:
    """'' when the append registers nobody; else the handle to reserve, or NO_HANDLE."""
    if not applied.registers:
        return ""
    return applied.handle or NO_HANDLE


def decode_entry(fields: dict) -> ev.Event | None:
    """A session stream or feed entry's event; None for an unknown type or a newer protocol's entry."""
    if protocol.is_newer(protocol.version_of(fields.get(b"v"))):
        return None
    return ev.decode(fields[b"type"].decode(), fields[b"data"])


def decode_entries(entries: list) -> Iterator[tuple[int, ev.Event | None]]:
    """(position, event) of each raw stream entry, as ``read_raw`` gives them, one at a time."""
    for entry_id, fields in entries:
        yield int(entry_id.split(b"-")[0]), decode_entry(fields)


def parse_append(reply: list) -> AppendResult:
    status = reply[0].decode() if isinstance(reply[0], bytes) else reply[0]
    value = reply[1]
    if status == "dup":
        return AppendResult("dup", record=decode_record(value))
    if status in ("ok", "conflict"):
        return AppendResult(status, version=int(value))
    return AppendResult(status)


class EventStore:
    STATE_FIELDS = ("version", "snapshot", "etag")

    def __init__(self, redis: Redis, config: ServiceConfig) -> None:
        self.redis = redis
        self.config = config
        self.directory = Directory(redis)
        self.states = StateCache()
        self._lanes = Lanes(redis, cluster=config.cluster)

    # ---- command and wake streams ------------------------------------------------------------

    async def ensure_command_group(self, streams: int) -> None:
        """Create the workers' group at the start of every command stream.

        Producers and workers both call this before their first command, so a
        command published before any worker ever ran is still read (a group
        created at ``$`` later would skip it).
        """
        for index in range(streams):
            await self._ensure_group(keys.command_stream(index), keys.COMMAND_GROUP)

    async def ensure_wake_groups(self, partitions: int) -> None:
        for partition in range(partitions):
            await self._ensure_group(keys.wake_stream(partition), keys.WAKE_GROUP)

    async def _ensure_group(self, stream: str, group: str) -> None:
        try:
            await self.redis.xgroup_create(stream, group, id="0", mkstream=True)
        except ResponseError as exc:
            if "BUSYGROUP" not in str(exc):
                raise

    # ---- state -------------------------------------------------------------------------------

    @staticmethod
    def state_key(record: SessionRecord) -> str:
        return keys.session_snapshot(record.partition, record.session_id)

    def parse_loaded(self, session_id: str, values: list) -> Loaded:
        version, snapshot, etag = values
        etag = etag.decode() if etag else ""
        state = self.states.get(session_id, etag)
        loaded = Loaded(state if state is not None else SessionState.from_json(snapshot), int(version or 0), etag)
        self.states.put(session_id, loaded)
        return loaded

    def held(self, session_id: str) -> Loaded | None:
        """The state this process last read or wrote for the session, unconfirmed (``StateCache.latest``)."""
        return self.states.latest(session_id)

    async def load(self, record: SessionRecord) -> Loaded:
        return self.parse_loaded(record.session_id, await self.redis.hmget(self.state_key(record), *self.STATE_FIELDS))

    async def load_many(self, records: list[SessionRecord]) -> dict[str, Loaded]:
        """Several sessions' states in one round trip."""
        if not records:
            return {}

        def build(batch) -> None:
            for record in records:
                batch.hmget(self.state_key(record), *self.STATE_FIELDS)

        replies = await self.read_round_trip(build)
        return {record.session_id: self.parse_loaded(record.session_id, r) for record, r in zip(records, replies)}

    async def load_for_sends(
        self, records: list[SessionRecord], calls: list[tuple[SessionRecord, str]], trees: list[SessionRecord]
    ) -> "SendReads":
        """Everything a batch of sends reads, in one round trip: the states, the idempotency records of
        tool calls ((sender, digest)), the grants of the senders' trees, and the service-wide drain flag."""
        calls = list(dict.fromkeys((sender.session_id, sender.partition, digest) for sender, digest in calls))
        roots = {r.root_session_id: r.partition for r in trees}

        def build(batch) -> None:
            for record in records:
                batch.hmget(self.state_key(record), *self.STATE_FIELDS)
            for session_id, partition, digest in calls:
                batch.hmget(keys.session_idempotency(partition, session_id), *record_fields(digest))
            for root, partition in roots.items():
                batch.execute_command("SMEMBERS", keys.tree_grants(partition, root))
            batch.execute_command("EXISTS", keys.service_drain())

        replies = await self.read_round_trip(build)
        loaded = {record.session_id: self.parse_loaded(record.session_id, r) for record, r in zip(records, replies)}
        replies = replies[len(records):]
        recorded = {(session_id, digest): kept_record(values) for (session_id, _, digest), values in zip(calls, replies)}
        replies = replies[len(calls):]
        grants = {root: frozenset(v.decode() for v in labels) for root, labels in zip(roots, replies)}
        return SendReads(loaded, recorded, grants, bool(replies[-1]))

    async def recorded(self, record: SessionRecord, digest: str) -> list | dict | None:
        """The idempotency record kept under ``digest`` with ``record``'s session, or None."""
        return kept_record(await self.redis.hmget(keys.session_idempotency(record.partition, record.session_id),
                                                  *record_fields(digest)))

    @staticmethod
    def record_outcome_call(sender: SessionRecord, digest: str, record: list | dict, pipe) -> None:
        """Keep a refusal that touched no session under its tool call: set once, then read back, so a
        concurrent decision of the same call is answered with whichever record was kept (two replies)."""
        key = keys.session_idempotency(sender.partition, sender.session_id)
        pipe.hsetnx(key, record_field(digest), encode_record(record))
        pipe.hget(key, record_field(digest))

    async def load_mail(self, record: SessionRecord, which: str = "all", message_id: str | None = None
                        ) -> dict[str, MailItem]:
        """The pending mail a decision reads (``Handler.reads_mail``): all, what a claim may take (the due
        hash), or one named item."""
        p, sid = record.partition, record.session_id
        if which == "named":
            return await self.load_mail_items(record, [message_id] if message_id else [])
        if which not in ("all", "due"):
            return {}

        def build(batch) -> None:
            batch.hgetall(keys.session_due(p, sid))
            if which == "all":
                batch.hgetall(keys.session_mail(p, sid))

        replies = await self.read_round_trip(build)
        due = replies[0]
        held = replies[1] if which == "all" else {}
        items = _mail_items((raw_id, raw_item) for raw_id, raw_item in due.items() if raw_item != _NAMED_ONLY)
        items.update(_mail_items(held.items()))
        # Items an older version named in the due hash are in the pending-mail hash, which "all" read already.
        named_only = [raw_id.decode() for raw_id, raw_item in due.items() if raw_item == _NAMED_ONLY]
        if named_only and which == "due":
            items.update(await self.load_mail_items(record, named_only))
        return items

    async def load_mail_items(self, record: SessionRecord, message_ids: list[str]) -> dict[str, MailItem]:
        """The named items, from whichever of the two hashes holds each (``commitplan.placement``)."""
        if not message_ids:
            return {}
        p, sid = record.partition, record.session_id

        def build(batch) -> None:
            batch.hmget(keys.session_due(p, sid), message_ids)
            batch.hmget(keys.session_mail(p, sid), message_ids)

        due, held = await self.read_round_trip(build)
        return {
            message_id: decode_item(message_id, raw)
            for message_id, in_due, in_held in zip(message_ids, due, held)
            if (raw := in_due if in_due not in (None, _NAMED_ONLY) else in_held) is not None
        }

    # ---- append ------------------------------------------------------------------------------

    def prepare(self, plan: CommitPlan, loaded: Loaded, *, held: Mapping[str, Loaded] | None = None,
                reply: Reply | None = None) -> PreparedAppend:
        """The commit script's keys and arguments for ``plan``, decided on ``loaded`` (its etag is the one the
        step expects); ``held``: the states its sources were decided on, by session id.

        ``reply``: the answer to push and the command to acknowledge once the append applies (only where
        ``answers_in_commit``).
        """
        record, applied = plan.record, plan.applied
        p, sid = record.partition, record.session_id
        encoded = [part for event in plan.events for part in ev.encode(event)]
        # Each ``MailChange`` as three arguments (an item done as ''): the Lua keeps each item in one place.
        changes = [part for message_id, item, where in plan.mail
                   for part in (message_id, encode_item(item) if item else "", where)]
        wakes = [wake_trigger(record, message_id, seq) for seq, message_id in applied.wakes]
        wakes += [interrupt_trigger(record, event, seq) for seq, event in applied.interrupts]
        index = approval_index(record, applied)
        key_list = list(_commit_keys(p, sid, record.root_session_id))
        kept = plan.idempotency
        if kept is not None:
            key_list[3] = keys.session_idempotency(p, kept.session_id)
        left = Loaded(applied.state, applied.version, os.urandom(8).hex())
        # Held under the new etag: used only once the server shows that etag, i.e. once this append applied.
        self.states.put(sid, left)
        operation, when = plan.due
        companions = self._sources(p, plan.sources, held or {}, key_list)
        if reply is not None:
            key_list.extend((reply.reply_list, reply.stream))
            answer, answer_ttl, command_group, entry_id = (reply.answer, keys.REPLY_TTL_S, keys.COMMAND_GROUP,
                                                           reply.entry_id)
        else:
            answer = answer_ttl = command_group = entry_id = ""
        # After the companions' keys and the answer's: the script reads it as the last KEY.
        key_list.append(keys.partition_drain(p))
        args = lay_out(Sections(
            etags=f"{loaded.etag} {left.etag}",
            snapshot=applied.state.to_json(),
            record=encode_record(kept.record) if kept is not None else "",
            record_field=record_field(kept.digest) if kept is not None else "",
            legacy_field=kept.digest if kept is not None else "",
            registration=registration_arg(applied),
            session=sid,
            feed_name=id_bytes(sid),
            feed_maxlen=self.config.feed_maxlen,
            due_op=operation,
            due_at="" if when is None else repr(when),
            answer=answer,
            answer_ttl=answer_ttl,
            command_group=command_group,
            entry_id=entry_id,
            drain_read="" if plan.read_draining is None else "1" if plan.read_draining else "0",
            protocol=PROTOCOL_VERSION,
            events=(len(plan.events), *encoded),
            mail=(len(changes) // 3, *changes),
            wakes=(len(wakes), *wakes),
            approvals=(len(index) // 2, *index),
            grants=(len(applied.tree_grants), *applied.tree_grants),
            outbound=(len(plan.outbound) // 2, *encode_outbound(plan.outbound)),
            companions=[companion for companion, _ in companions.values()],
        ))
        after = {session_id: left for session_id, (_, left) in companions.items()}
        return PreparedAppend(key_list, args, plan, left, after, answers=reply is not None)

    def _sources(self, partition: int, sources: list[SourceWrite], held: Mapping[str, Loaded],
                 key_list: list[str]) -> dict[str, tuple[CompanionSections, Loaded]]:
        """Adds each source's keys (the script's companions); returns, by session id, its sections of the
        script's arguments and the state it is left in."""
        companions: dict[str, tuple[CompanionSections, Loaded]] = {}
        for source in sources:
            record = source.record
            loaded = held[record.session_id]
            left = Loaded(source.state, loaded.version + len(source.events), os.urandom(8).hex())
            self.states.put(record.session_id, left)
            own = _commit_keys(partition, record.session_id, record.root_session_id)
            key_list.extend((own[0], own[1], own[2], own[11]))
            encoded = [part for event in source.events for part in ev.encode(event)]
            changes = [part for message_id, item, where in source.mail
                       for part in (message_id, encode_item(item) if item else "", where)]
            wakes = [wake_trigger(record, message_id, seq) for seq, message_id in source.wakes]
            operation, when = source.due
            companions[record.session_id] = (CompanionSections(
                etags=f"{loaded.etag} {left.etag}",
                snapshot=left.state.to_json(),
                session=record.session_id,
                feed_name=id_bytes(record.session_id),
                due_op=operation,
                due_at="" if when is None else repr(when),
                events=(len(source.events), *encoded),
                outbound=(len(source.outbound) // 2, *encode_outbound(source.outbound)),
                mail=(len(changes) // 3, *changes),
                wakes=(len(wakes), *wakes),
            ), left)
        return companions

    @property
    def answers_in_commit(self) -> bool:
        """Whether an append may carry its command's answer (``Reply``). Not on a cluster: a reply list and
        a command stream hash to slots of their own. Not under the durable or replicated profile: an answer
        waits for the fsync or the replicas (WAITAOF, WAIT after the append), and one pushed by the append
        itself would not."""
        return not self.config.cluster and self.config.profile == "fast"

    @functools.cached_property
    def commit_script(self) -> AsyncScript:
        """The commit script as redis-py keeps it: its SHA, and loading it when a server lacks it."""
        return self.redis.register_script(COMMIT_LUA)

    def commit_call(self, prepared: PreparedAppend, pipe) -> None:
        # execute_command, not pipe.evalsha: redis-py refuses the latter in cluster pipelines,
        # though EVALSHA routes by its first key like any keyed command.
        pipe.execute_command("EVALSHA", self.commit_script.sha, len(prepared.keys), *prepared.keys, *prepared.args)

    async def load_scripts(self) -> None:
        """Loads the commit script on the server (on a cluster, on every primary)."""
        await self.redis.script_load(self.commit_script.script)

    async def read_round_trip(self, build) -> list:
        """The replies to the reads ``build(batch)`` adds, in one round trip on a kept connection (``lanes``:
        a fresh read of a batch to decide is one per batch, and the pool's pipeline costs about as much
        again as the reads); a command the server refused raises its error, as a pipeline's would."""
        batch = CommandBatch()
        build(batch)
        return raise_refused(await self._lanes.run(batch.commands))

    async def run_pipeline(self, build) -> list:
        """Run the commands ``build(pipe)`` adds, in one round trip, ending with the durability wait.

        A server that lost its script cache (it restarted) answers NOSCRIPT and
        changes nothing; the commit script is loaded and the same commands run
        once more. The round trip goes out on a lane, not through a redis-py
        pipeline holding the ``Script``: that pipeline asks SCRIPT EXISTS
        before every round trip, a second one per batch.
        """
        batch = CommandBatch()
        build(batch)
        self.add_durability_wait(batch)
        try:
            return await self._attempt(batch.commands)
        except NoScriptError:
            # Nothing of the round trip was written: once the script is loaded again, the same commands run once
            # more. (A retry loop set up around every round trip cost about 20 us of a worker's CPU, a tenth of a
            # one-command batch.)
            await self.load_scripts()
            return await self._attempt(batch.commands)

    async def _attempt(self, commands: list[tuple]) -> list:
        """One round trip of ``commands``; a NOSCRIPT among the replies is raised (nothing was written)."""
        replies = await self._waited_round_trip(commands)
        lost = next((r for r in replies if isinstance(r, NoScriptError)), None)
        if lost is not None:
            raise lost
        if self.config.profile == "replicated" and not self.config.cluster:
            require_confirmed(replies.pop(), self.config)  # the WAIT ``add_durability_wait`` added
        return raise_refused(replies)

    async def append(self, prepared: PreparedAppend) -> AppendResult:
        replies = await self.run_pipeline(lambda pipe: self.commit_call(prepared, pipe))
        return parse_append(replies[0])

    async def _waited_round_trip(self, commands: list[tuple]) -> list:
        """The replicated profile on a cluster: each primary's share with its own WAIT (``replication``)."""
        if self.config.profile == "replicated" and self.config.cluster:
            return await run_waited(self.redis, commands, self.config)
        return await self._lanes.run(commands)

    def add_durability_wait(self, pipe) -> None:
        """Under the durable profile, the pipeline ends with WAITAOF: success only after the local fsync;
        under the replicated profile, on one server, with WAIT on the same connection: success only after
        ``min_replicas`` replicas have every write of the round trip.

        (A cluster's primaries fsync every write themselves, appendfsync always, checked at start; there
        the replicated profile's WAITs go out per primary, ``_waited_round_trip``.)
        """
        if self.config.cluster:
            return
        if self.config.profile == "durable":
            pipe.execute_command("WAITAOF", 1, 0, 0)
        elif self.config.profile == "replicated":
            pipe.execute_command(*wait_command(self.config))

    # ---- read --------------------------------------------------------------------------------

    async def read(
        self, record: SessionRecord, after: int = 0, count: int | None = None
    ) -> list[tuple[int, ev.Event]]:
        """Events after position ``after``, in order; unknown types are skipped.

        An entry of a newer protocol raises ``NewerProtocol``: history must not look complete when it is not.
        """
        entries = await self._range(record, after, count)
        for entry_id, fields in entries:
            protocol.require_known(fields.get(b"v"), f"event {entry_id.decode()} of session {record.session_id}")
        return [(seq, event) for seq, event in self._decode(entries) if event is not None]

    async def read_raw(
        self, record: SessionRecord, after: int = 0, count: int | None = None
    ) -> list[tuple[int, ev.Event | None]]:
        """Like ``read``, but an event of a type this version does not know, or of a newer protocol,
        is kept as None at its position (folds skip it)."""
        return self._decode(await self._range(record, after, count))

    async def read_entries(self, record: SessionRecord, after: int = 0, count: int | None = None) -> list:
        """The stream's entries after ``after``, undecoded: for a fold that decodes them one at a time
        (``decode_entries``) and so never holds a whole chunk of events at once."""
        return await self._range(record, after, count)

    async def _range(self, record: SessionRecord, after: int, count: int | None) -> list:
        return await self.redis.xrange(
            keys.session_stream(record.partition, record.session_id), min=f"({after}-0", count=count
        )

    @staticmethod
    def _decode(entries: list) -> list[tuple[int, ev.Event | None]]:
        return list(decode_entries(entries))

    async def entries_at(self, record: SessionRecord, seqs: list[int]) -> list[list]:
        """The raw entries at these positions, one list per position (empty where none is), in one round trip."""
        stream = keys.session_stream(record.partition, record.session_id)
        async with self.redis.pipeline(transaction=False) as pipe:
            for seq in seqs:
                pipe.xrange(stream, min=f"{seq}-0", max=f"{seq}-0")
            return await pipe.execute()

    async def read_at(self, record: SessionRecord, seqs: list[int]) -> dict[int, ev.Event]:
        out = {}
        for seq, entries in zip(seqs, await self.entries_at(record, seqs)):
            for _, fields in entries:
                event = decode_entry(fields)
                if event is not None:
                    out[seq] = event
        return out
