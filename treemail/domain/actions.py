"""Rules per action: ``message`` as before, and ``interrupt`` for interrupt_agent. Pure.

An agent document may give its rules flat (they are the ``message``
rules), or keyed by action:

    {"message": {"child": "allow", "sibling": "ask"}, "interrupt": {"child": "allow"}}

Keyed is recognised when a key is an action name or a value is a table of
rules (no relationship label is called ``message`` or ``interrupt``, so a flat
rule with such a pattern could never have matched anything); then every key
must be an action. Each action is deny by default, and its
tool is hidden without an allowing rule.
"""

from collections.abc import Mapping

from .permissions import InvalidRules, Rules, normalize_rules
from .results import clip

ACTIONS = ("message", "interrupt")
# An interrupt cannot wait for a person: by the time one answered, the run it
# was meant to stop would have moved on. So its rules allow or deny.
INTERRUPT_EFFECTS = ("allow", "deny")
# An error names this many unknown actions and counts the rest (a document with 10,000 keys is not echoed).
UNKNOWN_NAMED = 5


def split_actions(rules) -> tuple[Rules, Rules]:
    """(message rules, interrupt rules), each normalized.

    A mapping is keyed by action as soon as one key is an action name or one value is a table of rules, so a
    misspelt action (``mesage``) or an unknown one (``delegate``) is named as such instead of read as a flat
    rule with an odd effect.
    """
    if isinstance(rules, Mapping) and _keyed_by_action(rules):
        unknown = [clip(str(key), 40) for key in rules if key not in ACTIONS]
        if unknown:
            more = f" and {len(unknown) - UNKNOWN_NAMED} more" if len(unknown) > UNKNOWN_NAMED else ""
            raise InvalidRules(f"rules keyed by action take message and interrupt, got "
                               f"{', '.join(map(repr, unknown[:UNKNOWN_NAMED]))}{more}")
        message = normalize_rules(rules.get("message"))
        interrupt = normalize_rules(rules.get("interrupt"))
    else:
        message, interrupt = normalize_rules(rules), []
    for pattern, effect in interrupt:
        if effect not in INTERRUPT_EFFECTS:
            raise InvalidRules(f"interrupt rule {clip(pattern, 80)!r}: effect must be allow or deny, got "
                               f"{clip(effect, 80)!r}")
    return message, interrupt


def _keyed_by_action(rules: Mapping) -> bool:
    return any(key in ACTIONS or isinstance(value, (Mapping, list, tuple)) for key, value in rules.items())


def interrupt_visible(interrupt_rules: Rules) -> bool:
    return any(effect == "allow" for _, effect in interrupt_rules)
