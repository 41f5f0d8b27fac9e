"""The host API engines embed: ``from treemail import Treemail, SendContext`` (or ``from treemail.host import ...``).

The facade lives with the other producers (``treemail.producers.host``); this
module is its public address, with the configuration an engine connects with
and the installed distribution's version. ``TreemailError`` is the root of every
error the host raises for a caller's mistake or a refusal, each with its
stable ``code``.
"""

from importlib.metadata import PackageNotFoundError, version

from treemail.adapters.config import Config, ServiceConfig, load_config
from treemail.domain.errors import TreemailError
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

try:
    __version__ = version("treemail")
except PackageNotFoundError:  # run from a source tree that was never installed
    __version__ = "0+unknown"

__all__ = [
    "Treemail", "SendContext", "Registration", "Delivery", "Wake", "Interrupt", "SendAttempt", "Observed",
    "SubscriptionGap", "ToolResult", "Disposed", "result_text",
    "Config", "MessagingConfig", "ServiceConfig", "load_config", "__version__", "TreemailError",
]
