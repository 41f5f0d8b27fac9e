"""treemail: durable agent-to-agent mail for LLM agent delegation trees.

The one import surface for engine authors:

    from treemail import Treemail, SendContext, Config, load_config

Every name of the host API (``treemail.host``) is here, loaded on first use:
``import treemail`` alone stays as light as the domain needs it (the protocol
version), and the layering test accepts these deferred imports as the
package's face, the way it accepts ``treemail.host``.
"""

from importlib.metadata import PackageNotFoundError, version

PROTOCOL_VERSION = 3

try:
    __version__ = version("treemail")
except PackageNotFoundError:  # run from a source tree that was never installed
    __version__ = "0+unknown"

# The host API, in the order a reader meets it: the facade, its inputs, what it returns, its configuration.
FACE = (
    "Treemail", "SendContext", "Registration", "Delivery", "Wake", "Interrupt", "SendAttempt", "Observed",
    "SubscriptionGap", "ToolResult", "Disposed", "result_text",
    "Config", "MessagingConfig", "ServiceConfig", "load_config",
)
__all__ = ["PROTOCOL_VERSION", "__version__", *FACE]


def __getattr__(name: str):
    if name not in FACE:
        raise AttributeError(f"module 'treemail' has no attribute {name!r}")
    from treemail import host  # the package's face: deferred, so the floors below never load the host

    value = getattr(host, name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *FACE})
