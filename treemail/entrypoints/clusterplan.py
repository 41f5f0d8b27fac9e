"""`treemail cluster-plan`: which slots each master of a Redis/Valkey Cluster should own (``slotplan``), and
what to run to get there: on a new cluster, on one whose slots were split evenly, or (``--live``) on the
running cluster the configuration names, read with CLUSTER SHARDS."""

import asyncio
import json
from dataclasses import dataclass
from typing import Annotated, Optional

import typer

from treemail.adapters import slotmoves, slotplan

from .clicommon import ConfigOpt, JsonOpt, config_of, url_of


def _spans(ranges) -> str:
    return " ".join(f"{a}-{b}" if a != b else str(a) for a, b in ranges)


def _ids(values) -> str:
    return " ".join(map(str, values)) or "-"


def _addslots(master: slotplan.MasterPlan) -> list:
    return ["CLUSTER", "ADDSLOTSRANGE", *(s for r in master.ranges for s in r)]


@dataclass(frozen=True)
class LiveMaster:
    node_id: str
    host: str
    port: int
    ranges: list[tuple[int, int]]


def _fields(item) -> dict:
    """A CLUSTER SHARDS map, as a dict whether the client parsed it or left it a flat list."""
    return item if isinstance(item, dict) else dict(zip(item[::2], item[1::2]))


async def _live_masters(url: str) -> list[LiveMaster]:
    """The running cluster's masters (CLUSTER SHARDS on the configured node), numbered by their first slot."""
    import redis.asyncio as aioredis
    from redis.exceptions import ResponseError

    from treemail.adapters.connection import url_refused
    from treemail.domain.errors import ConfigError

    try:
        client = aioredis.Redis.from_url(url, decode_responses=True, socket_connect_timeout=2)
    except (ValueError, TypeError) as exc:
        raise url_refused(url, exc) from None
    async with client:
        try:
            shards = await client.execute_command("CLUSTER", "SHARDS")
        except ResponseError as exc:
            raise ConfigError(f"--live reads a Redis/Valkey Cluster's slots, and the server says: {exc}") from None
        except (ValueError, TypeError) as exc:
            raise url_refused(url, exc) from None
    out = []
    for shard in map(_fields, shards):
        master = next((n for n in map(_fields, shard["nodes"]) if n["role"] == "master"), None)
        if master is None:
            continue
        flat = [int(x) for x in shard["slots"]]
        out.append(LiveMaster(str(master["id"]), str(master.get("endpoint") or master["ip"]), int(master["port"]),
                              sorted(zip(flat[::2], flat[1::2]))))
    return sorted(out, key=lambda m: (m.ranges[0][0] if m.ranges else slotplan.SLOTS, m.node_id))


def cluster_plan(
    ctx: typer.Context,
    masters: Annotated[Optional[int], typer.Option(
        "--masters", help="the cluster's masters (primaries); default 3, or with --live the running cluster's",
        show_default=False)] = None,
    live: Annotated[bool, typer.Option("--live", help=(
        "read the running cluster's masters and slots from the configured server (REDIS_URL) and name the "
        "moves from there with each node's address and id"))] = False,
    as_json: JsonOpt = False,
    config: ConfigOpt = None,
) -> None:
    """Which slots each cluster master should own so the partitions and command streams spread evenly."""
    from treemail.domain.errors import ConfigError

    cfg = config_of(ctx, config)
    service = cfg.service
    running = asyncio.run(_live_masters(url_of(cfg))) if live else None
    if running is not None and masters is not None and masters != len(running):
        raise ConfigError(f"--masters {masters}, but the running cluster has {len(running)} masters")
    masters = len(running) if running is not None else 3 if masters is None else masters
    plan = slotplan.plan(masters, service.partitions, service.command_streams)
    if running is not None and sum(b - a + 1 for m in running for a, b in m.ranges) < slotplan.SLOTS:
        raise ConfigError("the running cluster leaves slots unassigned: give each master its planned ranges "
                          "with CLUSTER ADDSLOTSRANGE (`treemail cluster-plan` without --live)")
    current = [m.ranges for m in running] if running is not None else [[r] for r in slotmoves.even_split(masters)]
    plan = slotmoves.aligned(plan, current)  # its master k is the cluster's master k (numbered by first slot)
    moves = slotmoves.moves(plan, current)
    if as_json:
        print(json.dumps(_as_json(plan, moves, running), sort_keys=True))
    else:
        _show(plan, moves, running)


def _as_json(plan: slotplan.SlotPlan, moves: list[slotmoves.Move], running: list[LiveMaster] | None) -> dict:
    out = {**plan.to_json(), "new_cluster": [_addslots(m) for m in plan.masters]}
    if running is None:
        out["from_even_split"] = [m.to_json() for m in moves]
    else:
        nodes = [{"id": m.node_id, "host": m.host, "port": m.port} for m in running]
        out["from_live"] = [{**m.to_json(), "source_node": nodes[m.source], "target_node": nodes[m.target]}
                            for m in moves]
    return out


def _show(plan: slotplan.SlotPlan, moves: list[slotmoves.Move], running: list[LiveMaster] | None) -> None:
    from .output import table

    print(f"slot plan for {len(plan.masters)} masters, {plan.partitions} partitions, {plan.streams} command streams "
          "(a master's CPU follows the partitions' and command streams' hash tags it holds):")
    node = (lambda k: f" {running[k].host}:{running[k].port}") if running is not None else (lambda k: "")
    table([("master", "right"), ("slots", "right"), ("ranges", "left"), ("partitions", "left"),
           ("command streams", "left")],
          [[f"{m.index}{node(m.index)}", m.slots, _spans(m.ranges), _ids(m.partitions), _ids(m.streams)]
           for m in plan.masters])
    print("service-wide keys: " + "; ".join(f"{k['key']} (slot {k['slot']}) on master {k['master']}"
                                          for k in plan.service_keys()))
    print("keys named by an id (" + ", ".join(slotplan.SPREAD_KEYS) + ") hash over every slot: each master "
          "holds about its share of them.")
    print("\na new cluster: on each master, before joining them (instead of an even split such as "
          "`valkey-cli --cluster create` makes):")
    for m in plan.masters:
        print(f"  master {m.index}: {' '.join(map(str, _addslots(m)))}")
    which = "this cluster" if running is not None else "a running cluster split evenly"
    if not moves:
        print(f"\n{which} already holds this plan: nothing to move.")
        return
    print(f"\n{which}{'' if running is not None else ' (`valkey-cli --cluster create`)'}: {len(moves)} moves, "
          "masters numbered by their first slot; a move that carries partitions carries their trees, the others "
          "only keys named by an id:")
    for move in moves:
        carried = [f"partitions {_ids(move.partitions)}"] if move.partitions else []
        carried += [f"command streams {_ids(move.streams)}"] if move.streams else []
        print(f"  slots {_spans([(move.first, move.last)])}: master {move.source} -> master {move.target}"
              + (f" ({'; '.join(carried)})" if carried else ""))
        if running is not None:
            source, target = running[move.source], running[move.target]
            print(f"    valkey-cli -h {source.host} -p {source.port} CLUSTER MIGRATESLOTS SLOTSRANGE "
                  f"{move.first} {move.last} NODE {target.node_id}")
    print("  Valkey 9 or later, on the source master, atomically per range: "
          "CLUSTER MIGRATESLOTS SLOTSRANGE <first> <last> NODE <target's node id>")
    print("  older servers, per slot: CLUSTER SETSLOT <slot> IMPORTING <source id> on the target, CLUSTER SETSLOT "
          "<slot> MIGRATING <target id> on the source, MIGRATE its keys (CLUSTER GETKEYSINSLOT), then "
          "CLUSTER SETSLOT <slot> NODE <target id> on both")




def register(app: typer.Typer) -> None:
    app.command("cluster-plan")(cluster_plan)
