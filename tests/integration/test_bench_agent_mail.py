"""bench/agent_mail.py runs: at a tiny size, treemail's side of the side by side (nothing installed, no network),
and a failure of the other system becomes its rows' error, never the benchmark's end."""

from bench import agent_mail


async def test_the_side_by_side_phase_runs_treemails_conversations_at_a_tiny_size(redis_url):
    lines: list[str] = []
    out = await agent_mail.phase_agent_mail(redis_url, 0.5, lines.append, pairs=(1,), agent_mail=False)
    (row,) = out["treemail"].values()
    assert row["pairs"] == 1 and row["conversations"] >= 1 and row["failed"] == 0
    assert 0 < row["p50_ms"] <= row["p99_ms"]
    assert "agent_mail" not in out and any("1 pair(s)" in line for line in lines)


async def test_the_other_systems_failure_is_each_rows_error(monkeypatch):
    def no_install(log):
        raise RuntimeError("pip install failed")

    monkeypatch.setattr(agent_mail, "agent_mail_python", no_install)
    out = await agent_mail.agent_mail_side(0.1, lambda line: None, (1, 8))
    assert out == {f"pairs_{n}": {"pairs": n, "error": "RuntimeError: pip install failed"} for n in (1, 8)}
