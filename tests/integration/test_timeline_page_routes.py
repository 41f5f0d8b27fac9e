"""`treemail ui`'s routes against a real Valkey, without a browser: deep links load directly or say why not,
and every bad query parameter is a 400 with a clear message (`?at=²` was a server error: "²".isdigit())."""

import json
from urllib.parse import quote

from starlette.requests import Request

from treemail.entrypoints.ui import Page

from .conftest import make_config, running_stack
from .test_timeline import exchange


def request(path_params: dict, query: str = "") -> Request:
    return Request({"type": "http", "method": "GET", "path": "/", "headers": [], "path_params": path_params,
                    "query_string": query.encode()})


def answer(response) -> tuple[int, dict | str]:
    body = response.body.decode()
    return response.status_code, json.loads(body) if response.media_type == "application/json" else body


async def test_deep_links_load_directly_and_bad_query_parameters_are_400s(redis_url, calls):
    async with running_stack(redis_url) as host:
        root, child, ask, answer_id = await exchange(host, calls)
        page = Page(make_config(redis_url), token=None)
        await page.open()
        try:
            sid = child.session_id
            timeline = {"session_id": sid}
            status, now = answer(await page.session_timeline(request(timeline)))
            assert status == 200 and now["at"] == now["last"] > 3
            status, then = answer(await page.session_timeline(request(timeline, "at=3")))
            assert (status, then["at"]) == (200, 3)
            for query, code, says in (
                    (f"at={quote('²')}", "ui:invalid_position", "one non-negative integer"),
                    ("at=-1", "ui:invalid_position", "one non-negative integer"),
                    ("at=", "ui:invalid_position", "one non-negative integer"),
                    ("at=1&at=2", "ui:invalid_query", "given more than once"),
                    (f"at={now['last'] + 1}", "ui:invalid_position", f"(0..{now['last']})"),
                    ("when=3", "ui:invalid_query", "unknown query parameter 'when'")):
                for route in (page.session_timeline, page.session_link):
                    status, body = answer(await route(request(timeline, query)))
                    assert status == 400 and body["error"]["code"] == code and says in body["error"]["message"], (
                        query, body)

            # /s/<session>?at=<position> and /m/<message> are the page itself, or a 404 naming what is missing.
            status, html = answer(await page.session_link(request(timeline, "at=3")))
            assert status == 200 and "<script" in html
            status, body = answer(await page.session_link(request({"session_id": "nobody"})))
            assert (status, body["error"]["code"]) == (404, "ui:unknown_session")
            assert answer(await page.message_link(request({"message_id": answer_id})))[0] == 200
            status, body = answer(await page.message_link(request({"message_id": "nothing-here"})))
            assert (status, body["error"]["code"]) == (404, "ui:unknown_message")
            # Where a message landed, for the page to open it: agent mail (by its sender's record) and a
            # host's injected mail (no sender: found in the streams).
            status, found = answer(await page.message_session(request({"message_id": ask})))
            assert (status, found["session_id"]) == (200, sid)
            injected = await host.inject(root.session_id, "plugin", "the linter found 3 issues")
            status, found = answer(await page.message_session(request({"message_id": injected})))
            assert (status, found["session_id"]) == (200, root.session_id)
            # The routes that take no parameter say so too, rather than ignore a mistyped one.
            for route, params in ((page.trees, {}), (page.message_session, {"message_id": ask}),
                                  (page.message_chain, {"session_id": sid, "message_id": ask}),
                                  (page.message_link, {"message_id": ask}), (page.events, {})):
                status, body = answer(await route(request(params, "at=3")))
                assert (status, body["error"]["code"]) == (400, "ui:invalid_query"), route
        finally:
            await page.close()


async def test_a_message_link_finds_mail_with_no_sender_in_a_session_older_than_the_trees_list(redis_url, calls):
    async with running_stack(redis_url) as host:
        root, child, _, _ = await exchange(host, calls)
        injected = await host.inject(root.session_id, "plugin", "the linter found 3 issues")
        page = Page(make_config(redis_url), token=None, max_sessions=1)  # the trees list only the child
        await page.open()
        try:
            status, trees = answer(await page.trees(request({})))
            assert [t["session_id"] for t in trees["trees"]] == [child.session_id] and trees["not_listed"] == 1
            status, found = answer(await page.message_session(request({"message_id": injected})))
            assert (status, found["session_id"]) == (200, root.session_id)
        finally:
            await page.close()
