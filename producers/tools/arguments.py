"""What every model-facing tool's strict parser does first: a JSON object (or its text), with no key but its own.

Each tool raises with its own stable code (``invalid``); the unknown names are
echoed bounded, since a model that sent 100,000 keys must not get them back.
"""

import json
from collections.abc import Callable, Collection, Mapping
from typing import Any

from treemail.domain.errors import Rejected
from treemail.domain.results import clip

UNKNOWN_NAMED = 5


def json_object(raw: Any, invalid: Callable[[str], Rejected], expected: str) -> Mapping:
    """``raw`` as a mapping; ``expected`` says what the object holds, for the error."""
    if isinstance(raw, (str, bytes, bytearray)):
        try:
            raw = json.loads(raw)
        except (ValueError, UnicodeDecodeError, RecursionError):
            raise invalid("arguments are not a JSON object") from None
    if not isinstance(raw, Mapping):
        raise invalid(f"arguments must be a JSON object with {expected}")
    return raw


def refuse_unknown(raw: Mapping, allowed: Collection[str], invalid: Callable[[str], Rejected], hint: str = "") -> None:
    unknown = sorted(str(k) for k in raw if k not in allowed)
    if unknown:
        named = ", ".join(clip(name, 40) for name in unknown[:UNKNOWN_NAMED])
        more = f" and {len(unknown) - UNKNOWN_NAMED} more" if len(unknown) > UNKNOWN_NAMED else ""
        raise invalid(f"unknown argument(s) {named}{more}; allowed: {', '.join(allowed)}{hint}")
