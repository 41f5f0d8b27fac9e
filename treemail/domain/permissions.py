"""Relationship-labelled message permissions: label, match, visibility. Pure.

Rules come from the agent document: ``{"child": "allow", "sibling": "ask",
"*": "deny"}``, or a bare effect meaning ``{"*": effect}``. The label is the
recipient's relationship to the sender.
"""

import functools
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

from .limits import INVALID, MAX_RULES, IdentifierError
from .results import clip

Effect = Literal["allow", "ask", "deny"]
EFFECTS = ("allow", "ask", "deny")
Label = Literal["parent", "child", "sibling", "*"]
LABELS = ("parent", "child", "sibling", "*")

Rules = list[tuple[str, str]]


class InvalidRules(IdentifierError):
    """Rules a host gave that are not rules: the host API's one coded refusal of its input (nothing stored)."""

    def __init__(self, message: str) -> None:
        super().__init__(INVALID, message)


def normalize_rules(rules: str | Mapping[str, str] | Sequence[Sequence[str]] | None) -> Rules:
    """Rules as an ordered list of (pattern, effect); declaration order is the last tie-break."""
    if rules is None:
        return []
    if isinstance(rules, str):
        pairs: list[tuple[str, str]] = [("*", rules)]
    elif isinstance(rules, Mapping):
        pairs = [(k, v) for k, v in rules.items()]
    elif isinstance(rules, Sequence) and all(isinstance(p, Sequence) and not isinstance(p, str) and len(p) == 2
                                             for p in rules):
        pairs = [tuple(pair) for pair in rules]  # type: ignore[misc]
    else:
        raise InvalidRules("message rules are an effect, a mapping of pattern to effect, or (pattern, effect) pairs")
    if len(pairs) > MAX_RULES:
        raise InvalidRules(f"{len(pairs)} message rules; the limit is {MAX_RULES}")
    for pattern, effect in pairs:
        if not isinstance(pattern, str) or not isinstance(effect, str):
            raise InvalidRules(f"a message rule is a pattern and an effect, both strings, got "
                               f"{type(pattern).__name__} and {type(effect).__name__}")
        if effect not in EFFECTS:
            raise InvalidRules(f"message rule {clip(pattern, 80)!r}: effect must be one of {EFFECTS}, got "
                               f"{clip(effect, 80)!r}")
        if not pattern:
            raise InvalidRules("message rule pattern must not be empty")
        if not any(_matches(pattern, label) for label in LABELS):
            # A pattern no label can match (a misspelt ``chlid``) would deny every send without a word.
            raise InvalidRules(
                f"message rule {clip(pattern, 80)!r} matches no relationship: a pattern names parent, child, "
                "sibling or *, with the wildcards * and ?"
            )
    return [(p, e) for p, e in pairs]


@dataclass(frozen=True)
class Origin:
    session_id: str
    parent_session_id: str | None


def relationship(sender: Origin, recipient: Origin) -> Label:
    if sender.parent_session_id is not None and recipient.session_id == sender.parent_session_id:
        return "parent"
    if recipient.parent_session_id == sender.session_id:
        return "child"
    if sender.parent_session_id is not None and recipient.parent_session_id == sender.parent_session_id:
        return "sibling"
    return "*"


@functools.lru_cache(maxsize=4096)
def _compiled(pattern: str) -> re.Pattern:
    return re.compile("".join(".*" if ch == "*" else ("." if ch == "?" else re.escape(ch)) for ch in pattern))


def _matches(pattern: str, label: str) -> bool:
    return _compiled(pattern).fullmatch(label) is not None


def _specificity(pattern: str) -> tuple[int, int]:
    wildcards = sum(1 for ch in pattern if ch in "*?")
    return len(pattern) - wildcards, -wildcards


def best_rule(rules: Rules, label: str) -> tuple[str, str] | None:
    """The (pattern, effect) that decides ``label``: more literal characters win, then fewer
    wildcards, then the later declaration; None when no pattern matches."""
    best: tuple[tuple[int, int, int], tuple[str, str]] | None = None
    for index, (pattern, effect) in enumerate(rules):
        if _matches(pattern, label):
            rank = (*_specificity(pattern), index)
            if best is None or rank > best[0]:
                best = (rank, (pattern, effect))
    return best[1] if best else None


def evaluate(rules: Rules, label: str) -> Effect:
    """The effect of the deciding rule; deny by default."""
    rule = best_rule(rules, label)
    return rule[1] if rule else "deny"  # type: ignore[return-value]


def tool_visible(rules: Rules) -> bool:
    """Deny by default: the tool exists for a session only if some rule can let a send through."""
    return any(effect in ("allow", "ask") for _, effect in rules)
