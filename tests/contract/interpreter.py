"""Runs one case of ``host_contract.json`` on a backend: names resolved, each step's outcome checked.

The TypeScript suite (``clients/typescript/test/contract.test.mjs``) reads the same file with the same
rules; the two interpreters are kept small so a case means the same in both.
"""

import json
from pathlib import Path

CONTRACT = Path(__file__).with_name("host_contract.json")


def cases() -> list[dict]:
    return json.loads(CONTRACT.read_text())["cases"]


def at(value, path: str):
    """``value`` at a dotted path (list indexes as numbers); the empty path is the value itself."""
    for part in filter(None, path.split(".")):
        value = value[int(part)] if isinstance(value, list) else value[part]
    return value


def resolve(value, bound: dict):
    """``"$name.path"`` replaced by what step ``name`` answered, everywhere in ``value``."""
    if isinstance(value, str) and value.startswith("$"):
        name, _, path = value[1:].partition(".")
        return at(bound[name], path)
    if isinstance(value, dict):
        return {k: resolve(v, bound) for k, v in value.items()}
    if isinstance(value, list):
        return [resolve(v, bound) for v in value]
    return value


def check(step: dict, outcome, bound: dict) -> None:
    expect = resolve(step.get("expect") or {}, bound)
    where = f"{step['op']} {json.dumps(step.get('args'))}: {json.dumps(outcome, default=str)[:600]}"
    failed = isinstance(outcome, dict) and "error" in outcome
    if "error" in expect:
        assert failed and outcome["error"]["code"] == expect["error"], f"expected {expect['error']}; {where}"
        return
    assert not failed, f"refused; {where}"
    for path, wanted in expect.get("match", {}).items():
        assert at(outcome, path) == wanted, f"{path} should be {wanted!r}; {where}"
    for path, prefix in expect.get("prefix", {}).items():
        assert str(at(outcome, path)).startswith(prefix), f"{path} should start with {prefix!r}; {where}"
    for path, part in expect.get("includes", {}).items():
        assert part in at(outcome, path), f"{path} should include {part!r}; {where}"
    if "length" in expect:
        assert len(outcome) == expect["length"], f"length should be {expect['length']}; {where}"
    if "same_as" in expect:
        assert outcome == expect["same_as"], f"should be the same as {expect['same_as']}; {where}"


async def run_case(case: dict, call) -> None:
    """``call(op, args)``: the backend's outcome of one operation (a refusal as ``{"error": ...}``)."""
    bound: dict = {}
    for stage in ("given", "when", "then"):
        for step in case[stage]:
            args = resolve(step.get("args") or {}, bound)
            outcome = args["value"] if step["op"] == "echo" else await call(step["op"], args)
            check(step, outcome, bound)
            if "as" in step:
                bound[step["as"]] = outcome
