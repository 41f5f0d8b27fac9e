"""How the demo's scenarios check themselves: a scenario whose outcome is not what the stack promises fails."""

from treemail.domain.errors import TreemailError


class ScenarioFailed(TreemailError):
    """A scenario's outcome was not what the stack promises."""

    code = "demo:scenario_failed"


def expect(condition: bool, scenario: str, what: str) -> None:
    if not condition:
        raise ScenarioFailed(f"scenario {scenario}: {what}")
