"""The same conversation through an agent framework's own MCP client (the OpenAI Agents SDK's MCPServerStdio).

What a framework user writes: one MCPServerStdio per agent, pointed at `treemail mcp --receive`; the
framework lists the tools and calls them as its model asks. No treemail engine code runs beside it.
"""

import json

import pytest

agents_mcp = pytest.importorskip("agents.mcp")

from agents import RunContextWrapper  # noqa: E402

from treemail.domain import events as ev  # noqa: E402

from .conftest import running_stack  # noqa: E402
from .test_mcp import stdio  # noqa: E402
from .test_mcp_agents import RECEIVE, of, tree  # noqa: E402


def agent(url: str, session_id: str, name: str, structured: bool = True):
    params = stdio(url, session_id, RECEIVE)
    return agents_mcp.MCPServerStdio(
        {"command": params.command, "args": params.args, "env": params.env}, name=name,
        client_session_timeout_seconds=30, use_structured_content=structured,
    )


async def model_reads(server, name: str, arguments: dict) -> str:
    """What the framework hands its model as the tool's output (the SDK's own conversion of the result)."""
    tool = next(t for t in await server.list_tools() if t.name == name)
    output = await agents_mcp.MCPUtil.invoke_mcp_tool(server, tool, RunContextWrapper(context=None),
                                                      json.dumps(arguments))
    return output if isinstance(output, str) else json.dumps(output)


# With structured content on, the framework shows its model the structured result only; off, the text blocks.
@pytest.mark.parametrize("structured", [True, False])
async def test_steer_mail_riding_on_a_tool_result_reaches_the_model_in_the_form_the_framework_reads(
    redis_url, structured,
):
    async with running_stack(redis_url) as host:
        planner, explore = await tree(host)
        await host.start_run(planner.session_id, "planner-run")
        async with agent(redis_url, explore.session_id, "explore", structured) as b:
            sent = await host.send(planner.session_id, explore.handle, "stop and report")  # steer
            seen = await model_reads(b, "send_message", {"to": planner.handle, "body": "working on it"})
            assert "stop and report" in seen
            # The next call confirms it: only now that the model was shown it.
            await model_reads(b, "check_mail", {})
        consumed = of(await host.history(explore.session_id), ev.ProducerMessageConsumed)
        assert [e.message_id for e in consumed] == [sent["message_id"]]


async def test_two_agents_on_the_openai_agents_mcp_client_converse_and_a_drop_returns_the_message_once(redis_url):
    async with running_stack(redis_url) as host:
        planner, explore = await tree(host)
        async with agent(redis_url, planner.session_id, "planner") as a:
            async with agent(redis_url, explore.session_id, "explore") as b:
                assert {t.name for t in await b.list_tools()} >= {"send_message", "check_mail", "wait_for_mail"}
                sent = await a.call_tool("send_message", {"to": explore.handle, "body": "which tests fail?"})
                message_id = sent.structured_content["message_id"]
                got = await b.call_tool("check_mail", {})
                assert got.structured_content["messages"][0]["message_id"] == message_id
                # b drops here, before any call confirms the message.

            async with agent(redis_url, explore.session_id, "explore") as b:
                again = await b.call_tool("wait_for_mail", {"timeout_s": 10})
                assert [m["message_id"] for m in again.structured_content["messages"]] == [message_id]
                assert "which tests fail?" in again.content[0].text
                await b.call_tool("send_message", {"to": planner.handle, "body": "test_cache fails"})

            answer = await a.call_tool("wait_for_mail", {"timeout_s": 20})
            assert "test_cache fails" in answer.content[0].text
            await a.call_tool("acknowledge_mail", {})

        history = await host.history(explore.session_id)
        assert [e.message_id for e in of(history, ev.ProducerMessageConsumed)] == [message_id]
        assert [e.message_id for e in of(history, ev.ProducerMessageReleased)] == [message_id]
        assert len(of(await host.history(planner.session_id), ev.ProducerMessageConsumed)) == 1
