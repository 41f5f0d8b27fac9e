"""The host API engines embed: the ``Treemail`` facade (``facade.py``) and the parts it is composed of."""

from .facade import (
    Delivery,
    Disposed,
    Interrupt,
    Observed,
    Registration,
    SendAttempt,
    SendContext,
    SubscriptionGap,
    ToolResult,
    Treemail,
    Wake,
)

__all__ = [
    "Treemail", "SendContext", "Registration", "Delivery", "Wake", "Interrupt", "SendAttempt", "Observed",
    "SubscriptionGap", "ToolResult", "Disposed",
]
