"""Every example in the docs runs: the ```python blocks of each docs/*.md page and of README.md, in order,
in one namespace per page, against a real stack.

The convention (docs/index.md states it for authors): a block runs with ``tm`` (a connected ``Treemail``),
``env`` (its ``treemail.testing.TestStack``: ``env.advance(seconds)`` skips time) and ``SendContext`` already
there, and may ``await`` at top level. A block that must not run (it needs an API key, a process of its
own, ...) starts with the line ``# not run: <why>``. A block indented under a list item would be skipped
without a word, so an indented fence fails here instead.
"""

import ast
import inspect
import os
import re
import sys
from pathlib import Path

import pytest

from treemail.host import SendContext

from .conftest import timed_stack

ROOT = Path(__file__).resolve().parents[2]
PAGES = sorted((ROOT / "docs").glob("*.md")) + [ROOT / "README.md"]
BLOCK = re.compile(r"^```python\n(.*?)^```$", re.M | re.S)
NOT_RUN = "# not run:"


def examples(page: Path) -> list[str]:
    return [block for block in BLOCK.findall(page.read_text(encoding="utf-8"))
            if not block.startswith(NOT_RUN)]


def test_the_docs_have_examples_and_every_skipped_one_says_why():
    assert PAGES and sum(len(examples(page)) for page in PAGES) >= 10
    for page in PAGES:
        text = page.read_text(encoding="utf-8")
        for block in BLOCK.findall(text):
            if block.startswith(NOT_RUN):
                assert block.splitlines()[0].strip() != NOT_RUN, f"{page.name}: a skipped example must say why"
        indented = [line for line in text.splitlines() if re.match(r"\s+```python", line)]
        assert not indented, f"{page.name}: an indented example would never run: {indented}"


@pytest.mark.parametrize("page", [p for p in PAGES if examples(p)], ids=lambda p: p.name)
async def test_every_example_on_the_page_runs(redis_url, page, monkeypatch):
    # As for a reader who installed treemail: its command on the PATH, REDIS_URL naming the server.
    monkeypatch.setenv("PATH", os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", ""))
    monkeypatch.setenv("REDIS_URL", redis_url)
    async with timed_stack(redis_url) as env:
        namespace = {"__name__": f"docs.{page.stem}", "tm": env.tm, "env": env, "SendContext": SendContext}
        for index, source in enumerate(examples(page), start=1):
            code = compile(source, f"{page.name} example {index}", "exec", flags=ast.PyCF_ALLOW_TOP_LEVEL_AWAIT)
            result = eval(code, namespace)  # noqa: S307 - the docs' own examples, checked in with the code
            if inspect.isawaitable(result):
                await result
