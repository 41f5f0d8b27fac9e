"""Content blocks through the real stack: an image delivered to a model that reads images, refused for another."""

import base64

import pytest

from treemail.domain import events as ev

from .conftest import live, running_stack

pytestmark = pytest.mark.cluster

PNG = base64.b64encode(b"\x89PNG\r\n\x1a\n" + bytes(range(64))).decode()
IMAGE = {"type": "image", "media_type": "image/png", "data": PNG}


async def test_an_image_message_is_delivered_with_its_image_parts_and_refused_for_a_text_only_model(redis_url, calls):
    async with running_stack(redis_url, content_blocks=True) as host:
        root = await host.register_root("planner", "plans", rules={"child": "allow"})
        sees = await host.register_child(root.session_id, "vision", "reads charts", rules={"parent": "allow"},
                                         accepts_images=True, status="running")
        blind = await host.register_child(root.session_id, "explore", "reads code", rules={"parent": "allow"},
                                          status="running")
        await live(host, root)  # only a session's open run may send (exact live sender)
        body = [{"type": "text", "text": "the chart:"}, IMAGE, {"type": "text", "text": "what trend?"}]

        accepted = await host.send_message(calls.ctx(root.session_id), {"to": sees.handle, "body": body})
        refused = await host.send_message(calls.ctx(root.session_id), {"to": blind.handle, "body": body})

        assert "message_id" in accepted, accepted
        assert refused["error"]["code"] == "send_message:model_does_not_support_images"
        assert await host.obligations.pending_mail(blind.session_id) == []

        await host.start_run(sees.session_id, "run-v1")
        [delivery] = await host.claim(sees.session_id, "run-v1")
        assert delivery.message_id == accepted["message_id"]
        assert delivery.text == (
            f'<agent_message from="{root.handle}">\nthe chart:\n\n[image 1]\n\nwhat trend?\n\n'
            f'[use `send_message(to="{root.handle}", ...)` to reply]\n</agent_message>'
        )
        assert delivery.parts == ({"type": "text", "text": delivery.text}, {**IMAGE, "index": 1})
        [stored] = [e for _, e in await host.history(sees.session_id) if isinstance(e, ev.ProducerMessageAccepted)]
        assert stored.blocks == body

        # The same text as plain mail is delivered to the text-only model as before.
        plain = await host.send_message(calls.ctx(root.session_id), {"to": blind.handle, "body": "what trend?"})
        assert "message_id" in plain
        definition = await host.tool_definition(root.session_id)
        assert definition["input_schema"]["properties"]["body"]["anyOf"][1]["type"] == "array"


async def test_by_default_the_body_is_a_string_and_a_block_body_is_invalid(stack, calls):
    root = await stack.register_root("planner", "plans", rules={"child": "allow"})
    child = await stack.register_child(root.session_id, "vision", "reads charts", accepts_images=True)
    result = await stack.send_message(calls.ctx(root.session_id), {"to": child.handle, "body": [IMAGE]})
    assert result["error"]["code"] == "send_message:invalid_arguments"
    assert (await stack.tool_definition(root.session_id))["input_schema"]["properties"]["body"]["type"] == "string"


async def test_the_size_limit_counts_the_image(redis_url, calls):
    async with running_stack(redis_url, content_blocks=True, max_body_bytes=len(PNG) + 3) as host:
        root = await host.register_root("planner", "plans", rules={"child": "allow"})
        child = await host.register_child(root.session_id, "vision", "charts", accepts_images=True)
        await live(host, root)
        fits = await host.send_message(calls.ctx(root.session_id), {"to": child.handle,
                                                                    "body": [{"type": "text", "text": "abc"}, IMAGE]})
        over = await host.send_message(calls.ctx(root.session_id), {"to": child.handle,
                                                                    "body": [{"type": "text", "text": "abcd"}, IMAGE]})
        assert "message_id" in fits
        assert over["error"]["code"] == "send_message:invalid_body"
