"""The host API's side of "any agent": tool schemas, calls by tool name, tokens; the subcommands' functions;
and the AsyncAPI payloads checked against what the real stack puts on the reply and wake channels."""

import asyncio
import json

import pytest

from treemail.adapters import keys
from treemail.adapters.codec import encode_command
from treemail.adapters.wire import Reply, WakeTrigger
from treemail.domain import ids
from treemail.domain.commands import SendArguments, SendContext, SendMessage
from treemail.domain.errors import UnknownSessionError
from treemail.entrypoints import cli
from treemail.adapters.commandclient import command_stream
from treemail.producers.tools import schemas as toolschemas
from treemail.producers.tools import table as tools

from .conftest import adapters, live, running_stack


async def test_tool_schemas_give_each_format_of_the_installed_tools_and_nothing_without_rules(stack):
    root = await stack.register_root("planner", "plans", rules={"child": "allow"})
    silent = await stack.register_child(root.session_id, "explore", "reads")
    canonical = [await stack.tool_definition(root.session_id)]
    for fmt in toolschemas.FORMATS:
        assert await stack.tools.schemas(root.session_id, fmt) == toolschemas.export(canonical, fmt)
        assert await stack.tools.schemas(silent.session_id, fmt) == []
    with pytest.raises(ValueError):
        await stack.tools.schemas(root.session_id, "yaml")


async def test_call_tool_takes_an_openai_strict_call_with_null_for_the_omitted_mode(stack, calls):
    root = await stack.register_root("planner", "plans", rules={"child": "allow"})
    child = await stack.register_child(root.session_id, "explore", "reads")
    await live(stack, root)  # only a session's open run may send (exact live sender)
    # What an OpenAI strict function call carries: a JSON string with every property, null for defaults.
    arguments = json.dumps({"to": child.handle, "body": "look", "mode": None})
    result = await stack.tools.call(calls.ctx(root.session_id), "send_message", arguments)
    assert result["mode"] == "steer" and "message_id" in result


async def test_call_tool_answers_a_tool_the_session_does_not_have_with_unknown_tool(stack, calls):
    root = await stack.register_root("planner", "plans", rules={"child": "allow"})
    silent = await stack.register_child(root.session_id, "explore", "reads")
    for session_id, name in ((silent.session_id, "send_message"), (root.session_id, "delete_everything")):
        result = await stack.tools.call(calls.ctx(session_id), name, {"to": root.handle, "body": "x"})
        assert result["error"]["code"] == "unknown_tool"
    assert tools.result_text("send_message", result).startswith("unknown_tool: ")


async def test_tokens_are_minted_only_for_real_sessions_and_stored_only_as_digests(stack):
    with pytest.raises(UnknownSessionError):
        await stack.tools.mint_token(ids.uuid7())
    root = await stack.register_root("planner", "plans", rules={"child": "allow"})
    token = await stack.tools.mint_token(root.session_id, "run-1", ttl_s=60)
    stored = [k async for k in adapters(stack).redis.scan_iter(match="tm:token:*")]
    assert len(stored) == 1 and token.encode() not in stored[0]
    assert token.encode() not in await adapters(stack).redis.get(stored[0])
    assert 0 < await adapters(stack).redis.ttl(stored[0]) <= 60


async def test_tool_schema_and_asyncapi_subcommands_print_json(stack, monkeypatch, capsys, redis_url):
    monkeypatch.setenv("REDIS_URL", redis_url)
    root = await stack.register_root("planner", "plans", rules={"child": "allow"})
    assert await _main(["tool-schema", root.session_id, "--format", "openai"]) == 0
    assert json.loads(capsys.readouterr().out) == await stack.tools.schemas(root.session_id, "openai")
    assert await _main(["tool-schema", ids.uuid7()]) == 2
    assert capsys.readouterr().err.startswith("treemail: error: no session has id")
    assert await _main(["asyncapi"]) == 0
    assert json.loads(capsys.readouterr().out)["channels"].keys() == {"commands", "replies", "wakes"}


async def _main(argv: list[str]) -> int:
    # The subcommands run their own event loop (asyncio.run), as from a shell.
    return await asyncio.to_thread(cli.main, argv)


async def test_what_the_stack_puts_on_the_reply_and_wake_channels_is_the_documented_payload(redis_url):
    async with running_stack(redis_url) as host:
        root = await host.register_root("planner", "plans", rules={"child": "allow"})
        child = await host.register_child(root.session_id, "explore", "reads", status="finished")
        await live(host, root)  # only a session's open run may send (exact live sender)
        # A command published by hand, answered on a reply list of our own.
        reply_to = ids.uuid7()
        for call_id, to in (("c-1", child.handle), ("c-2", "nobody_12345678")):
            context = SendContext(root.session_id, "run-1", call_id)
            command = SendMessage(ids.uuid7(), context, SendArguments(to, "hi", "queue"), reply_to)
            stream = command_stream(adapters(host).config.service, command.context.session_id)
            await adapters(host).redis.xadd(stream, {"__data__": encode_command(command)})
        answers = [await adapters(host).redis.blpop([keys.reply_list(reply_to)], timeout=10) for _ in range(2)]
        decisions = [Reply.model_validate_json(raw).root for _, raw in answers]
        assert {type(d).__name__ for d in decisions} == {"AcceptedReply", "RefusedReply"}

        partition = (await adapters(host).sessions.record(child.session_id)).partition
        ((_, fields),) = await adapters(host).redis.xrange(keys.wake_stream(partition))
        trigger = WakeTrigger.model_validate_json(fields[b"data"])
        assert (trigger.session_id, fields[b"session"].decode()) == (child.session_id, child.session_id)

