"""The settlement and disposal scene of `make run`, played through the real stack."""

from treemail.entrypoints.demo_settlement import demo_settlement


async def test_demo_shows_a_settlement_notice_and_a_refused_send_to_a_disposed_session(stack):
    lines: list[str] = []
    await demo_settlement(stack, lines.append)
    out = "\n".join(lines)
    assert "Before you finish, send your result to that agent with send_message(" in out
    assert '<treemail_notice kind="subagent_settled">' in out
    assert "finished and will do no further work unless you send it more.\n    \n    cache.py: 2 stale-read" in out
    assert "=> send_message:recipient_closing" in out
    assert '<treemail_notice kind="message_returned">' in out and "Write the summary." in out
    assert await stack.wakes("nobody-else", block_ms=100) == []  # it leaves no wake for the main script


async def test_operator_commands_drain_and_dispose(stack):
    from treemail.entrypoints.lifecycle_commands import dispose_command, drain_command

    root = await stack.register_root("planner", "x", rules={"child": "allow"})
    child = await stack.register_child(root.session_id, "explore", "x")
    assert (await drain_command(stack)).startswith("the service is draining")
    assert await drain_command(stack, lift=True) == "the service takes new sends again"
    assert (await drain_command(stack, child.session_id)).startswith("1 sessions draining")
    assert await dispose_command(stack, child.session_id, "aborted") == (
        f"disposed {child.session_id}: 0 unprocessed messages returned to their senders; parent notice: not_announced"
    )
