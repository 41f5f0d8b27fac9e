"""The host's session overlay of message rules: decided like every other command, recorded as an event."""

from .. import events as ev
from ..commands import OverlayMessageRules
from .lifecycle import Given, require_registered


def decide_overlay_rules(command: OverlayMessageRules, given: Given) -> list[ev.Event]:
    require_registered(given.state)
    rules = [(str(pattern), str(effect)) for pattern, effect in command.rules]
    if tuple(rules) == given.state.rules_overlay:
        return []
    return [ev.MessageRulesOverlaid(at=given.now, rules=rules)]
