"""`treemail cluster-plan`: which slots each master of a Redis/Valkey Cluster should own (``slotplan``), and
what to run to get there, on a new cluster and on one whose slots were split evenly."""

import json
from typing import Annotated

import typer

from treemail.adapters import slotplan

from .clicommon import ConfigOpt, JsonOpt, config_of


def _spans(ranges) -> str:
    return " ".join(f"{a}-{b}" if a != b else str(a) for a, b in ranges)


def _ids(values) -> str:
    return " ".join(map(str, values)) or "-"


def _addslots(master: slotplan.MasterPlan) -> list:
    return ["CLUSTER", "ADDSLOTSRANGE", *(s for r in master.ranges for s in r)]


def cluster_plan(
    ctx: typer.Context,
    masters: Annotated[int, typer.Option("--masters", help="the cluster's masters (primaries)")] = 3,
    as_json: JsonOpt = False,
    config: ConfigOpt = None,
) -> None:
    """Which slots each cluster master should own so the partitions and command streams spread evenly."""
    from .output import table

    service = config_of(ctx, config).service
    plan = slotplan.plan(masters, service.partitions, service.command_streams)
    even = [[r] for r in slotplan.even_split(masters)]
    moves = slotplan.moves(plan, even)
    if as_json:
        print(json.dumps({**plan.to_json(), "new_cluster": [_addslots(m) for m in plan.masters],
                          "from_even_split": [m.to_json() for m in moves]}, sort_keys=True))
        return
    print(f"slot plan for {masters} masters, {plan.partitions} partitions, {plan.streams} command streams "
          "(a master's CPU follows the partitions' and command streams' hash tags it holds):")
    table([("master", "right"), ("slots", "right"), ("ranges", "left"), ("partitions", "left"),
           ("command streams", "left")],
          [[m.index, m.slots, _spans(m.ranges), _ids(m.partitions), _ids(m.streams)] for m in plan.masters])
    print("service-wide keys: " + "; ".join(f"{k['key']} (slot {k['slot']}) on master {k['master']}"
                                          for k in plan.service_keys()))
    print("keys named by an id (" + ", ".join(slotplan.SPREAD_KEYS) + ") hash over every slot: each master "
          "holds about its share of them.")
    print("\na new cluster: on each master, before joining them (instead of an even split such as "
          "`valkey-cli --cluster create` makes):")
    for m in plan.masters:
        print(f"  master {m.index}: {' '.join(map(str, _addslots(m)))}")
    if not moves:
        print("\na running cluster split evenly already holds this plan: nothing to move.")
        return
    print(f"\na running cluster split evenly (`valkey-cli --cluster create`): {len(moves)} moves, master numbers "
          "as the even split numbers them (by their first slot); a move that carries partitions carries their "
          "trees, the others only keys named by an id:")
    for move in moves:
        carried = [f"partitions {_ids(move.partitions)}"] if move.partitions else []
        carried += [f"command streams {_ids(move.streams)}"] if move.streams else []
        print(f"  slots {_spans([(move.first, move.last)])}: master {move.source} -> master {move.target}"
              + (f" ({'; '.join(carried)})" if carried else ""))
    print("  Valkey 9 or later, on the source master, atomically per range: "
          "CLUSTER MIGRATESLOTS SLOTSRANGE <first> <last> NODE <target's node id>")
    print("  older servers, per slot: CLUSTER SETSLOT <slot> IMPORTING <source id> on the target, CLUSTER SETSLOT "
          "<slot> MIGRATING <target id> on the source, MIGRATE its keys (CLUSTER GETKEYSINSLOT), then "
          "CLUSTER SETSLOT <slot> NODE <target id> on both")


def register(app: typer.Typer) -> None:
    app.command("cluster-plan")(cluster_plan)
