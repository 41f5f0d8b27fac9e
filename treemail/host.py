"""The host API engines embed: ``from treemail.host import Treemail, SendContext``.

The facade lives with the other producers (``treemail.producers.host.facade``); this
module is its public address.
"""

from treemail.producers.host import (
    Delivery,
    Disposed,
    Observed,
    Registration,
    SendAttempt,
    SendContext,
    SubscriptionGap,
    ToolResult,
    Treemail,
    Wake,
)
from treemail.producers.tools.table import result_text

__all__ = [
    "Treemail", "SendContext", "Registration", "Delivery", "Wake", "SendAttempt", "Observed", "SubscriptionGap",
    "ToolResult", "result_text", "Disposed",
]
