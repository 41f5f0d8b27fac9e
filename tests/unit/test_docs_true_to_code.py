"""What the docs say of the code, checked against it: every configuration key with its real default, every
CLI command, every error code of the tools."""

import re
import tomllib
from pathlib import Path

from treemail.adapters.config import Config
from treemail.domain.errors import Code
from treemail.entrypoints.cli import app

DOCS = Path(__file__).resolve().parents[2] / "docs"


def test_every_configuration_key_is_documented_with_its_real_default():
    page = (DOCS / "operations.md").read_text(encoding="utf-8")
    block = page.split("Every key, with its default:", 1)[1].split("```toml\n", 1)[1].split("```", 1)[0]
    documented = tomllib.loads(block)
    defaults = Config()
    for table in ("messaging", "service"):
        model = getattr(defaults, table)
        fields = set(type(model).model_fields) - {"redis_url", "idempotency_ttl_s"}
        assert set(documented[table]) == fields, (table, set(documented[table]) ^ fields)
        for key, value in documented[table].items():
            assert getattr(model, key) == value, f"[{table}] {key}: the docs say {value!r}"
    assert defaults.service.redis_url is None and "redis_url" not in documented["service"]


def test_every_command_is_in_the_cli_reference():
    page = (DOCS / "operations.md").read_text(encoding="utf-8")
    listed = set(re.findall(r"^treemail ([a-z-]+)", page, re.M))
    commands = {c.name or c.callback.__name__.replace("_", "-") for c in app.registered_commands}
    commands |= {g.name for g in app.registered_groups}
    assert commands - {None} <= listed, commands - listed


def test_every_error_code_of_the_tools_is_documented():
    page = (DOCS / "tools.md").read_text(encoding="utf-8")
    missing = [code.value for code in Code if f"`{code.value}`" not in page and f"`:{code.value.split(':')[-1]}`"
               not in page]
    assert not missing, missing
