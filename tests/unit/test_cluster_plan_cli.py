"""`treemail cluster-plan`: the plan for the configured partitions and command streams, in one JSON object or
as text with what to run; a bad --masters is one line."""

import json

from treemail.adapters import slotmoves, slotplan
from treemail.entrypoints.cli import main


def test_the_plan_follows_the_configured_partitions_and_streams(capsys, monkeypatch, tmp_path):
    config = tmp_path / "treemail.toml"
    config.write_text("[service]\npartitions = 8\ncommand_streams = 3\n")
    monkeypatch.setenv("TREEMAIL_CONFIG", str(config))
    assert main(["cluster-plan", "--masters", "3", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert (out["partitions"], out["command_streams"]) == (8, 3)
    planned = slotmoves.aligned(slotplan.plan(3, 8, 3), [[r] for r in slotmoves.even_split(3)])
    assert out == json.loads(json.dumps({**planned.to_json(), "new_cluster": out["new_cluster"],
                                         "from_even_split": out["from_even_split"]}))
    assert sorted(len(m["partitions"]) for m in out["masters"]) == [2, 3, 3]
    first = out["masters"][0]
    assert out["new_cluster"][0] == ["CLUSTER", "ADDSLOTSRANGE", *(s for r in first["ranges"] for s in r)]


def test_the_text_names_the_commands_for_a_new_and_a_running_cluster(capsys, monkeypatch):
    monkeypatch.delenv("TREEMAIL_CONFIG", raising=False)
    assert main(["cluster-plan", "--masters", "3"]) == 0
    out = capsys.readouterr().out
    assert "16 partitions, 4 command streams" in out
    assert out.count("CLUSTER ADDSLOTSRANGE") == 3
    assert "CLUSTER MIGRATESLOTS SLOTSRANGE" in out
    moves = slotmoves.moves(slotplan.plan(3, 16, 4), [[r] for r in slotmoves.even_split(3)])
    for move in moves:
        assert f"slots {move.first}-{move.last}: master {move.source} -> master {move.target}" in out


def test_a_bad_number_of_masters_is_one_line(capsys, monkeypatch):
    monkeypatch.delenv("TREEMAIL_CONFIG", raising=False)
    assert main(["cluster-plan", "--masters", "0"]) == 2
    err = capsys.readouterr().err
    assert err == "treemail: error: masters must be between 1 and 1000, not 0\n"
    assert main(["cluster-plan", "--masters", "many"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--masters" in err


def test_live_without_a_server_is_one_line(capsys, monkeypatch):
    monkeypatch.delenv("TREEMAIL_CONFIG", raising=False)
    monkeypatch.delenv("REDIS_URL", raising=False)
    monkeypatch.delenv("TREEMAIL_SERVICE_REDIS_URL", raising=False)
    assert main(["cluster-plan", "--live"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("treemail: error: no server: set REDIS_URL")
