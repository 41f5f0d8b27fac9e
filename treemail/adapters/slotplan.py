"""Which slots each master of a Redis/Valkey Cluster should own, so that the work spreads over the masters.

Every tree's keys share its partition's hash tag ``{pN}`` and every command stream has a tag of its own
``{cN}`` (``keys``): each decision commits on its tree's partition slot, and each command is read and
acknowledged on its stream's slot. So what a master spends follows which of those few slots it owns, not
how many slots it owns. An even split of slot ranges (what ``valkey-cli --cluster create`` does, and
``LocalValkeyCluster`` without a plan) leaves that to where the tags happen to hash: 16 partitions fall
4 / 5 / 7 over three masters, 4 command streams 1 / 2 / 1, and on the benchmark's local cluster the masters'
shares of Valkey's CPU were 0.26 / 0.34 / 0.40; placed by this plan, 0.32 / 0.32 / 0.35.

The plan places them on purpose: each master holds the partitions and the command streams within one of an
even share of each, a master with one more partition than another holding no more command streams than it
(the extra streams go to the masters with fewer partitions first), in few contiguous slot ranges: a
greedy walk over the tagged slots in order cuts them into runs of one owner, and the slots no partition or
stream uses fill the runs out so every master owns 16384 / masters slots, give or take one (the keys named
by an id, below, spread with them); where the runs' gaps cannot even that out, blocks of untagged slots
move to the masters short of their share (7 ranges for the default service on three masters).

The service-wide keys carry no partition tag: a few fixed keys, each on one slot the plan names with its
master, and the keys named by an id (directory entries, reply lists, tokens, peer routes, approval wake-ups),
which hash over every slot and so land on each master about as its share of the slots.

Pure: no I/O, nothing but the slot function (CRC16, as every cluster client computes it).
"""

from dataclasses import dataclass

from redis.crc import key_slot

from . import keys

SLOTS = 16384
# A cluster's recommended upper size (the cluster bus's design point); the plan itself would go further.
MAX_MASTERS = 1000

# The keys of the whole service with no partition tag: one slot each, wherever it hashes.
SERVICE_KEYS = {
    "drain flag": keys.service_drain(),
    "worker members": keys.worker_members(),
    "projection workers": keys.projection_members(),
    "dead letters": keys.dead_letters(),
}
# The keys named by an id: spread over every slot by the id's hash.
SPREAD_KEYS = {
    "directory": keys.directory("<session id>"),
    "reply lists": keys.reply_list("<client id>"),
    "access tokens": keys.access_token("<digest>"),
    "approval wake-ups": keys.approval_notify("<request id>"),
    "peer routes": keys.peer_routes("<kind>", "<source>"),
}


def slot_of(key: str) -> int:
    return key_slot(key.encode())


def partition_slot(partition: int) -> int:
    return slot_of(keys.feed(partition))


def stream_slot(index: int) -> int:
    return slot_of(keys.command_stream(index))


@dataclass(frozen=True)
class MasterPlan:
    index: int
    ranges: tuple[tuple[int, int], ...]  # inclusive, ascending
    partitions: tuple[int, ...]
    streams: tuple[int, ...]

    @property
    def slots(self) -> int:
        return sum(last - first + 1 for first, last in self.ranges)

    def to_json(self) -> dict:
        return {"master": self.index, "ranges": [list(r) for r in self.ranges], "slots": self.slots,
                "partitions": list(self.partitions), "command_streams": list(self.streams)}


@dataclass(frozen=True)
class SlotPlan:
    partitions: int
    streams: int
    masters: tuple[MasterPlan, ...]

    def owner(self, slot: int) -> int:
        for master in self.masters:
            if any(first <= slot <= last for first, last in master.ranges):
                return master.index
        raise ValueError(f"slot {slot} is not in 0..{SLOTS - 1}")

    def service_keys(self) -> list[dict]:
        return [{"name": name, "key": key, "slot": slot_of(key), "master": self.owner(slot_of(key))}
                for name, key in SERVICE_KEYS.items()]

    def to_json(self) -> dict:
        return {"masters": [m.to_json() for m in self.masters], "partitions": self.partitions,
                "command_streams": self.streams, "service_keys": self.service_keys(),
                "spread_keys": dict(SPREAD_KEYS)}


@dataclass
class TaggedSlot:
    """One slot some tags share (two tags may hash to one slot: they cannot be separated)."""

    slot: int
    partitions: list[int]
    streams: list[int]


def tagged_slots(partitions: int, streams: int) -> list[TaggedSlot]:
    """The slots the partitions' and command streams' tags hash to, in order, with whose tags each holds."""
    by_slot: dict[int, TaggedSlot] = {}
    for p in range(partitions):
        by_slot.setdefault(partition_slot(p), TaggedSlot(partition_slot(p), [], [])).partitions.append(p)
    for c in range(streams):
        by_slot.setdefault(stream_slot(c), TaggedSlot(stream_slot(c), [], [])).streams.append(c)
    return [by_slot[s] for s in sorted(by_slot)]


def quotas(masters: int, partitions: int, streams: int) -> tuple[list[int], list[int]]:
    """Each master's partitions and command streams: the extra partitions to the first masters, the extra
    streams to the last, so a master holds both extras only when there are more extras than masters."""
    need_p = [partitions // masters + (1 if i < partitions % masters else 0) for i in range(masters)]
    need_s = [streams // masters + (1 if i >= masters - streams % masters else 0) for i in range(masters)]
    return need_p, need_s


def _walk(units: list[TaggedSlot], masters: int, need_p: list[int], need_s: list[int]) -> list[tuple[int, list[TaggedSlot]]]:
    """The tagged slots in order, cut into runs of one owner each: the current owner keeps taking while its
    quota allows; otherwise the master whose quota takes the longest run from here (a master with no run yet
    first, then the lowest index)."""

    def fits(k: int, unit: TaggedSlot, p: list[int], s: list[int]) -> bool:
        return p[k] >= len(unit.partitions) and s[k] >= len(unit.streams)

    def reach(k: int, start: int) -> int:
        p, s, n = need_p[k], need_s[k], 0
        for j in range(start, len(units)):
            p, s = p - len(units[j].partitions), s - len(units[j].streams)
            if p < 0 or s < 0:
                break
            n += 1
        return n

    runs: list[tuple[int, list[TaggedSlot]]] = []
    owned = [0] * masters
    for i, unit in enumerate(units):
        owner = runs[-1][0] if runs else None
        if owner is None or not fits(owner, unit, need_p, need_s):
            takers = [k for k in range(masters) if fits(k, unit, need_p, need_s)]
            if takers:
                owner = max(takers, key=lambda k: (reach(k, i), owned[k] == 0, -k))
            else:  # tags sharing a slot and no quota left that takes them whole: the least overdrawn
                owner = max(range(masters), key=lambda k: (need_p[k] - len(unit.partitions)
                                                           + need_s[k] - len(unit.streams), -k))
            runs.append((owner, []))
            owned[owner] += 1
        runs[-1][1].append(unit)
        need_p[owner] -= len(unit.partitions)
        need_s[owner] -= len(unit.streams)
    return runs


def _cuts(runs: list[tuple[int, list[TaggedSlot]]], masters: int) -> list[int]:
    """Where each run ends (exclusive): within the gap its tagged slots leave, each master's runs adding up to
    about its even share of the slots (a few sweeps, each moving a master's cuts by what it still lacks)."""
    n = len(runs)
    target = [SLOTS // masters + (1 if k < SLOTS % masters else 0) for k in range(masters)]
    lower = []
    seen_last = -1
    for j, (_, units) in enumerate(runs):
        if units:
            seen_last = units[-1].slot
        lower.append(seen_last + 1)
    upper = [SLOTS - (n - 1 - j) for j in range(n)]
    for j in range(n - 2, -1, -1):  # the first tagged slot of any later run
        following = runs[j + 1][1]
        upper[j] = min(upper[j], upper[j + 1], following[0].slot if following else SLOTS)
    # The first guess: cuts midway between the runs' tagged slots, each master's runs scaled to its share.
    midway = [(lower[j] + upper[j]) / 2 for j in range(n - 1)] + [SLOTS]
    natural = [max(1.0, midway[j] - (midway[j - 1] if j else 0)) for j in range(n)]
    mine = [0.0] * masters
    for (owner, _), length in zip(runs, natural):
        mine[owner] += length
    natural = [length * target[owner] / mine[owner] for (owner, _), length in zip(runs, natural)]
    want = list(natural)
    held = [0] * masters  # runs per master
    for owner, _ in runs:
        held[owner] += 1
    cuts: list[int] = []
    for _ in range(64):
        cuts, start = [], 0
        for j in range(n):
            if j == n - 1:
                end = SLOTS
            else:
                end = min(max(round(start + want[j]), lower[j], start + 1), upper[j])
            cuts.append(end)
            start = end
        got = [0] * masters
        start = 0
        for (owner, _), end in zip(runs, cuts):
            got[owner] += end - start
            start = end
        if all(abs(got[k] - target[k]) <= 1 for k in range(masters)):
            break
        for j, (owner, _) in enumerate(runs):
            want[j] = max(1.0, want[j] + (target[owner] - got[owner]) / held[owner])
    return cuts


def _free_blocks(owner: list[int], tagged: set[int], master: int) -> list[tuple[int, int]]:
    """(start, end exclusive) of each stretch of ``master``'s slots that no tag uses."""
    blocks, slot = [], 0
    while slot < SLOTS:
        if owner[slot] != master or slot in tagged:
            slot += 1
            continue
        end = slot
        while end < SLOTS and owner[end] == master and end not in tagged:
            end += 1
        blocks.append((slot, end))
        slot = end
    return blocks


def _even_out(owner: list[int], tagged: set[int], masters: int) -> None:
    """Moves slots no tag uses from the masters over their share to those under it, until every master owns
    its share (16384 / masters, give or take one): a block next to the taker's own slots first (no new
    range), then one at the end of the giver's range (no split), else from the middle of the widest."""
    target = [SLOTS // masters + (1 if k < SLOTS % masters else 0) for k in range(masters)]
    count = [0] * masters
    for k in owner:
        count[k] += 1
    while True:
        short = max(range(masters), key=lambda k: (target[k] - count[k], -k))
        givers = sorted((k for k in range(masters) if count[k] > target[k]), key=lambda k: (target[k] - count[k], k))
        found = next(((k, blocks) for k in givers if (blocks := _free_blocks(owner, tagged, k))), None)
        if count[short] >= target[short] or found is None:
            return  # even, or every slot over a share carries a tag (tags outnumber what a share can hold)
        over, blocks = found

        def beside(start: int, end: int) -> tuple[bool, bool]:
            return start > 0 and owner[start - 1] == short, end < SLOTS and owner[end] == short

        def edges(start: int, end: int) -> tuple[bool, bool]:
            return start == 0 or owner[start - 1] != over, end == SLOTS or owner[end] != over

        start, end = max(blocks, key=lambda b: (any(beside(*b)), any(edges(*b)), b[1] - b[0], -b[0]))
        take = min(target[short] - count[short], count[over] - target[over], end - start)
        (left, right), (left_edge, right_edge) = beside(start, end), edges(start, end)
        if right or (not left and right_edge and not left_edge):
            first = end - take
        elif left or left_edge:
            first = start
        else:
            first = start + (end - start - take) // 2
        owner[first:first + take] = [short] * take
        count[short] += take
        count[over] -= take


def plan(masters: int, partitions: int, streams: int) -> SlotPlan:
    """The slots of ``masters`` masters for a service of ``partitions`` partitions and ``streams`` command
    streams: every slot 0..16383 owned by exactly one master."""
    if not 1 <= masters <= MAX_MASTERS:
        raise ValueError(f"masters must be between 1 and {MAX_MASTERS}, not {masters}")
    if partitions < 1 or streams < 1:
        raise ValueError("partitions and command streams must be at least 1")
    need_p, need_s = quotas(masters, partitions, streams)
    units = tagged_slots(partitions, streams)
    runs = _walk(units, masters, need_p, need_s)
    owner: list[int] = []
    for (k, _), end in zip(runs, _cuts(runs, masters)):
        owner.extend([k] * (end - len(owner)))
    _even_out(owner, {u.slot for u in units}, masters)
    ranges: dict[int, list[tuple[int, int]]] = {k: [] for k in range(masters)}
    start = 0
    for slot in range(1, SLOTS + 1):
        if slot == SLOTS or owner[slot] != owner[start]:
            ranges[owner[start]].append((start, slot - 1))
            start = slot
    # Masters numbered in the order of their first slot, as an even split numbers them.
    order = list(dict.fromkeys(owner))
    order += [k for k in range(masters) if k not in order]
    ranges = {new: ranges[old] for new, old in enumerate(order)}
    rank = {old: new for new, old in enumerate(order)}
    owner = [rank[k] for k in owner]
    held_p: dict[int, list[int]] = {k: [] for k in range(masters)}
    held_s: dict[int, list[int]] = {k: [] for k in range(masters)}
    for unit in units:
        held_p[owner[unit.slot]].extend(unit.partitions)
        held_s[owner[unit.slot]].extend(unit.streams)
    return SlotPlan(partitions, streams, tuple(
        MasterPlan(k, tuple(ranges[k]), tuple(sorted(held_p[k])), tuple(sorted(held_s[k]))) for k in range(masters)
    ))
