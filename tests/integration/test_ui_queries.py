"""`treemail ui`'s JSON routes answer every bad query parameter 400 with a clear message, never 500."""

import asyncio
import contextlib
import urllib.error
import urllib.request
import json

import pytest

from treemail.entrypoints.ui import Page, create_app
from treemail.projections.mailboxes import MAX_SESSIONS

from .conftest import make_config, running_stack, serving


@contextlib.asynccontextmanager
async def ui_page(redis_url: str):
    async with serving(create_app(make_config(redis_url))) as url:
        yield f"{url}/"


def get(url: str) -> tuple[int, dict]:
    try:
        with urllib.request.urlopen(url, timeout=20) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read())


@pytest.mark.parametrize("query, code", [
    ("at=%C2%B2", "ui:invalid_position"),        # "²": a digit to str.isdigit, not to int()
    ("at=%D9%A3", "ui:invalid_position"),        # an Arabic-Indic three
    ("at=-1", "ui:invalid_position"),
    ("at=", "ui:invalid_position"),
    ("at=" + "9" * 19, "ui:invalid_position"),
    ("at=1&at=2", "ui:invalid_query"),
    ("since=1", "ui:invalid_query"),
])
async def test_a_bad_query_parameter_is_a_400_naming_it(redis_url, query, code):
    async with running_stack(redis_url) as host:
        root = await host.register_root("planner", "plans", rules={"child": "allow"})
        async with ui_page(redis_url) as page:
            timeline = f"{page}api/sessions/{root.session_id}/timeline"
            status, body = await asyncio.to_thread(get, f"{timeline}?{query}")
            assert (status, body["error"]["code"]) == (400, code), body
            assert body["error"]["message"].split()[0] in ("at", "unknown", "query")
            status, body = await asyncio.to_thread(get, f"{page}api/trees?{query}")  # takes no parameter at all
            assert (status, body["error"]["code"]) == (400, "ui:invalid_query"), body
            assert (await asyncio.to_thread(get, f"{timeline}?at=1"))[0] == 200


async def test_the_trees_list_the_newest_sessions_and_say_how_many_older_ones_they_leave_out(redis_url):
    async with running_stack(redis_url) as host:
        roots = [(await host.register_root("planner", f"plans {n}")).session_id for n in range(5)]
        newest = sorted(roots)[-2:]  # ids are time-ordered
        config = make_config(redis_url)
        async with serving(create_app(config, page=Page(config, None, max_sessions=2))) as url:
            status, body = await asyncio.to_thread(get, f"{url}/api/trees")
        assert status == 200, body
        assert sorted(t["session_id"] for t in body["trees"]) == newest
        assert (body["not_listed"], body["max_sessions"]) == (3, 2)
        async with ui_page(redis_url) as page:  # the default lists all five
            status, body = await asyncio.to_thread(get, f"{page}api/trees")
        assert (len(body["trees"]), body["not_listed"], body["max_sessions"]) == (5, 0, MAX_SESSIONS)
