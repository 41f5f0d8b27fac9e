"""How the demo's scenarios check themselves: a scenario whose outcome is not what the stack promises fails."""


class ScenarioFailed(Exception):
    """A scenario's outcome was not what the stack promises."""


def expect(condition: bool, scenario: str, what: str) -> None:
    if not condition:
        raise ScenarioFailed(f"scenario {scenario}: {what}")
