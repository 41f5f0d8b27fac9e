"""The host API engines embed: ``from treemail import Treemail, SendContext`` (or ``from treemail.host import ...``).

The facade lives with the other producers (``treemail.producers.host``); this
module is its public address, with the configuration an engine connects with.
"""

from treemail.adapters.config import Config, ServiceConfig, load_config
from treemail.domain.messaging import MessagingConfig
from treemail.producers.host.facade import (
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
from treemail.producers.tools.table import result_text

__all__ = [
    "Treemail", "SendContext", "Registration", "Delivery", "Wake", "Interrupt", "SendAttempt", "Observed",
    "SubscriptionGap", "ToolResult", "Disposed", "result_text",
    "Config", "MessagingConfig", "ServiceConfig", "load_config",
]
