"""Searching a tree's mail: the host API, the CLI and the installable search_mail tool, bounded and authorised."""

import itertools
import json
import os
import subprocess
import sys

import pytest

from ..conftest import backend_env
from .conftest import Calls

# Delivery, threads and reads run the same on a 3-master cluster (a tree's keys share one slot).
pytestmark = pytest.mark.cluster


def cli(redis_url, *args):
    """The CLI against the test's server, a cluster's too."""
    env = {**os.environ, "REDIS_URL": redis_url, **backend_env()}
    return subprocess.run([sys.executable, "-m", "treemail", *args], env=env, capture_output=True, text=True,
                          timeout=60)


async def tree_with_mail(stack):
    root = await stack.register_root("planner", "plans", rules={"child": "allow"})
    a = await stack.register_child(root.session_id, "alpha", "", rules={"parent": "allow", "sibling": "allow"})
    b = await stack.register_child(root.session_id, "beta", "", rules={"parent": "allow", "sibling": "allow"})
    stranger = await stack.register_root("other", "another tree", rules={"*": "allow"})
    for session, run in ((root, "r"), (a, "a"), (b, "b"), (stranger, "s")):
        await stack.start_run(session.session_id, f"{run}-run")
    calls = Calls()
    sent = {
        "to_a": await stack.send_message(calls.ctx(root.session_id, "r-run"), {"to": a.handle, "body": "Cache eviction bug"}),
        "to_b": await stack.send_message(calls.ctx(root.session_id, "r-run"), {"to": b.handle, "body": "write the docs"}),
        "a_to_b": await stack.send_message(calls.ctx(a.session_id, "a-run"), {"to": b.handle, "body": "the cache is yours"}),
    }
    return root, a, b, stranger, {k: v["message_id"] for k, v in sent.items()}


async def test_host_search_by_text_sender_and_time_newest_first(stack):
    root, a, b, stranger, sent = await tree_with_mail(stack)
    found = await stack.history.search(root.session_id, text="CACHE")
    assert [r["message_id"] for r in found] == [sent["a_to_b"], sent["to_a"]]
    assert found[0]["from"] == a.handle and found[0]["to"] == b.handle

    assert [r["message_id"] for r in await stack.history.search(b.session_id, sender=a.handle)] == [sent["a_to_b"]]
    last_at = found[0]["at"]
    assert [r["message_id"] for r in await stack.history.search(root.session_id, since=last_at)] == [sent["a_to_b"]]
    assert sent["a_to_b"] not in [r["message_id"] for r in await stack.history.search(root.session_id, until=last_at)]
    assert len(await stack.history.search(root.session_id, limit=1)) == 1
    assert await stack.history.search(stranger.session_id, text="cache") == []  # another tree's mail is not its

    with pytest.raises(ValueError, match="limit"):
        await stack.history.search(root.session_id, limit=1000)


async def test_search_mail_tool_reads_only_the_callers_own_mail(stack):
    root, a, b, stranger, sent = await tree_with_mail(stack)
    context = Calls().ctx(root.session_id, "r-run")
    assert "search_mail" not in [d["name"] for d in await stack.tools.definitions(root.session_id)]
    await stack.tools.install(root.session_id, ["search_mail"])
    assert "search_mail" in [d["name"] for d in await stack.tools.definitions(root.session_id)]

    result = await stack.tools.call(context, "search_mail", {"text": "cache"})
    # root sent "Cache eviction bug"; alpha's note to beta is not root's mail.
    assert [r["message_id"] for r in result["messages"]] == [sent["to_a"]]
    assert stack.tools.result_text("search_mail", result).startswith(f"[{sent['to_a']}] from {root.handle}")

    bad = await stack.tools.call(context, "search_mail", {"text": "x", "who": root.session_id})
    assert bad["error"]["code"] == "search_mail:invalid_arguments"


async def test_cli_search_prints_rows_and_json_and_refuses_a_bad_time_in_one_line(stack, redis_url):
    root, a, b, stranger, sent = await tree_with_mail(stack)
    rows = cli(redis_url, "search", root.session_id, "--text", "cache")
    assert rows.returncode == 0, rows.stderr
    assert [line.split()[0] for line in rows.stdout.splitlines()] == [sent["a_to_b"], sent["to_a"]]
    machine = cli(redis_url, "search", root.handle, "--sender", a.handle, "--json")
    assert [json.loads(line)["message_id"] for line in machine.stdout.splitlines()] == [sent["a_to_b"]]
    bad = cli(redis_url, "search", root.session_id, "--since", "yesterday")
    assert bad.returncode != 0 and bad.stderr.count("\n") == 1 and "--since" in bad.stderr

    first = cli(redis_url, "search", root.handle, "--limit", "2")
    assert [line.split()[0] for line in first.stdout.splitlines()] == [sent["a_to_b"], sent["to_b"]]
    cursor = first.stderr.split("--cursor ")[1].strip()
    rest = cli(redis_url, "search", root.handle, "--limit", "2", "--cursor", cursor, "--json")
    assert [json.loads(line)["message_id"] for line in rest.stdout.splitlines()] == [sent["to_a"]]
    assert rest.returncode == 0 and rest.stderr == ""  # the last page: no cursor
    other = cli(redis_url, "search", root.handle, "--text", "cache", "--cursor", cursor)
    assert other.returncode != 0 and other.stderr.count("\n") == 1 and "another search" in other.stderr


async def test_search_mail_pages_with_a_cursor_that_pages_only_the_search_that_gave_it(stack):
    root, a, b, stranger, sent = await tree_with_mail(stack)
    calls = Calls()
    calls.counter = itertools.count(100)  # tool call ids tree_with_mail's sends did not use
    for n in range(3):
        await stack.send_message(calls.ctx(root.session_id, "r-run"), {"to": a.handle, "body": f"page note {n}"})
    await stack.send_message(calls.ctx(root.session_id, "r-run"), {"to": b.handle, "body": "page note 3"})
    for session in (root, a, stranger):
        await stack.tools.install(session.session_id, ["search_mail"])
    context = calls.ctx(root.session_id, "r-run")
    everything = (await stack.tools.call(context, "search_mail", {"limit": 100}))["messages"]
    assert len(everything) == 6 and sent["a_to_b"] not in [r["message_id"] for r in everything]  # root's own only

    pages, cursor = [], None
    while True:
        arguments = {"limit": 4 if not pages else 2, **({"cursor": cursor} if cursor else {})}
        result = await stack.tools.call(context, "search_mail", arguments)
        pages.append([r["message_id"] for r in result["messages"]])
        cursor = result.get("next_cursor")
        if cursor is None:
            break
        assert f'cursor="{cursor}"' in stack.tools.result_text("search_mail", result)  # a text-reading model pages too
    assert [len(p) for p in pages] == [4, 2]
    assert [m for p in pages for m in p] == [r["message_id"] for r in everything]  # newest first, none twice

    first = await stack.tools.call(context, "search_mail", {"limit": 1})
    # Another session's search (its own mail, its tree), or other criteria: the cursor is refused, never a position.
    for session, run, arguments in ((a, "a-run", {}), (stranger, "s-run", {}), (root, "r-run", {"text": "note"})):
        refused = await stack.tools.call(calls.ctx(session.session_id, run), "search_mail",
                                         {**arguments, "cursor": first["next_cursor"]})
        assert refused["error"]["code"] == "search_mail:invalid_arguments", refused
    garbage = await stack.tools.call(context, "search_mail", {"cursor": "not-a-cursor"})
    assert garbage["error"]["code"] == "search_mail:invalid_arguments"

    host_page = await stack.history.search_page(root.session_id, limit=5)
    assert len(host_page["messages"]) == 5 and "next_cursor" in host_page
    rest = await stack.history.search_page(root.session_id, limit=5, cursor=host_page["next_cursor"])
    assert len(rest["messages"]) == 2 and "next_cursor" not in rest  # the tree's 7 (a's note to b included)

async def test_search_mail_never_ends_a_page_silently_and_its_cursor_reaches_every_match(stack):
    root = await stack.register_root("planner", "plans", rules={"child": "allow"})
    child = await stack.register_child(root.session_id, "explore", "reads", rules={}, status="idle")
    await stack.start_run(root.session_id, "r-run")
    calls = Calls()
    sent = [(await stack.send_message(calls.ctx(root.session_id, "r-run"), {"to": child.handle,
                                                                              "body": f"note {i}"}))["message_id"]
            for i in range(4)]  # the pair window holds four
    await stack.tools.install(root.session_id, ["search_mail"])
    context = calls.ctx(root.session_id, "r-run")
    seen, arguments = [], {"text": "note", "limit": 3}
    while True:
        page = await stack.tools.call(context, "search_mail", arguments)
        seen += [r["message_id"] for r in page["messages"]]
        if page.get("next_cursor") is None:
            break
        assert 'search again with cursor="' in stack.tools.result_text("search_mail", page)
        arguments = {**arguments, "cursor": page["next_cursor"]}
    assert sorted(seen) == sorted(sent) and len(seen) == len(sent)
    bad = await stack.tools.call(context, "search_mail", {"text": "note", "cursor": "nowhere"})
    assert bad["error"]["code"] == "search_mail:invalid_arguments"
