"""Effective message permissions: the agent document's rules under the host's session overlay. Pure.

The agent document's rules come with the session's registration and never
change. The host may lay an overlay of rules over them at run time
(``MessageRulesOverlaid`` on the session's stream, so history and replay show
it). A label any overlay pattern matches is decided by the overlay alone,
with the usual ranking among its rules; any other label by the agent
document; a label neither matches is denied.

Visibility: without an overlay the default rule holds (the tool exists when
some rule is allow or ask). With one, the tool exists when some label
(``parent``, ``child``, ``sibling``, ``*``) resolves to allow or ask, so an
overlay can both hide and reveal it.
"""

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Literal

from . import permissions
from .records import SessionRecord

LABELS = ("parent", "child", "sibling", "*")
Source = Literal["overlay", "agent", "default"]


@dataclass(frozen=True)
class Resolution:
    label: str
    effect: permissions.Effect
    source: Source
    # The deciding rule's pattern; None when nothing matched (deny by default).
    pattern: str | None = None

    def describe(self) -> str:
        if self.source == "default":
            return "no rule matches: deny by default"
        return f"{self.source} rule {self.pattern!r}: {self.effect}"


def resolve(rules: permissions.Rules, overlay: Iterable[tuple[str, str]], label: str) -> Resolution:
    overlay = list(overlay)
    if overlay:
        rule = permissions.best_rule(overlay, label)
        if rule is not None:
            return Resolution(label, rule[1], "overlay", rule[0])  # type: ignore[arg-type]
    rule = permissions.best_rule(rules, label)
    if rule is not None:
        return Resolution(label, rule[1], "agent", rule[0])  # type: ignore[arg-type]
    return Resolution(label, "deny", "default")


def effect(rules: permissions.Rules, overlay: Iterable[tuple[str, str]], label: str) -> permissions.Effect:
    return resolve(rules, overlay, label).effect


@dataclass(frozen=True)
class Visibility:
    visible: bool
    reason: str


def visibility(
    rules: permissions.Rules, send_message_tool: bool = True, overlay: Iterable[tuple[str, str]] = ()
) -> Visibility:
    overlay = list(overlay)
    if not send_message_tool:
        return Visibility(False, "the host registered this session without the send_message tool")
    if not overlay:
        if permissions.tool_visible(rules):
            return Visibility(True, "the agent document has an allow or ask rule")
        return Visibility(False, "the agent document has no allow or ask rule (deny by default)")
    open_labels = [label for label in LABELS if effect(rules, overlay, label) != "deny"]
    if open_labels:
        return Visibility(True, f"under the session overlay, {', '.join(open_labels)} resolve to allow or ask")
    return Visibility(False, "under the session overlay every label resolves to deny")


def tool_visible(record: SessionRecord, overlay: Iterable[tuple[str, str]] = ()) -> bool:
    return visibility(record.rules, record.send_message_tool, overlay).visible


# ---- what `treemail permissions SESSION` shows ---------------------------------------------------


def report(record: SessionRecord, overlay, peers: list, messaging_enabled: bool = True) -> dict:
    """For one session: the tool's visibility and why, and per label the effect, the deciding rule and
    the sessions of the tree the label covers (``peers``: ``records.Peer`` of everyone else in the tree)."""
    overlay = [tuple(rule) for rule in overlay]
    seen = visibility(record.rules, record.send_message_tool, overlay)
    covered: dict[str, list[str]] = {label: [] for label in LABELS}
    for peer in sorted(peers, key=lambda p: p.record.handle or p.record.session_id):
        label = permissions.relationship(record.origin, peer.record.origin)
        covered[label].append(peer.record.handle or peer.record.session_id)
    labels = {}
    for label in LABELS:
        resolution = resolve(record.rules, overlay, label)
        labels[label] = {
            "effect": resolution.effect, "source": resolution.source, "rule": resolution.pattern,
            "decided_by": resolution.describe(), "sessions": covered[label],
        }
    return {
        "session_id": record.session_id, "handle": record.handle, "messaging_enabled": messaging_enabled,
        "tool": {"visible": seen.visible, "reason": seen.reason},
        "rules": [list(rule) for rule in record.rules], "overlay": [list(rule) for rule in overlay],
        "labels": labels,
    }


SESSIONS_SHOWN = 10


def render_report(data: dict) -> str:
    name = data["handle"] or data["session_id"]
    tool = "visible" if data["tool"]["visible"] else "hidden"
    lines = [f"{name} ({data['session_id']})", f"send_message tool: {tool} ({data['tool']['reason']})"]
    if not data["messaging_enabled"]:
        lines.append("messaging is disabled ([messaging] enabled = false): every send fails send_message:disabled")
    lines.append(f"agent rules: {_rules_text(data['rules'])}")
    lines.append(f"session overlay: {_rules_text(data['overlay'])}")
    for label, item in data["labels"].items():
        sessions = item["sessions"]
        shown = ", ".join(sessions[:SESSIONS_SHOWN]) or "nobody"
        if len(sessions) > SESSIONS_SHOWN:
            shown += f" and {len(sessions) - SESSIONS_SHOWN} more"
        lines.append(f"  {label:<8} {item['effect']:<5} by {item['decided_by']}; covers {shown}")
    return "\n".join(lines)


def _rules_text(rules) -> str:
    return ", ".join(f"{pattern}: {effect}" for pattern, effect in rules) or "(none)"
