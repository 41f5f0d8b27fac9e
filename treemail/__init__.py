"""treemail: durable agent-to-agent mail for LLM agent delegation trees."""

from importlib.metadata import PackageNotFoundError, version

PROTOCOL_VERSION = 4

try:
    __version__ = version("treemail")
except PackageNotFoundError:  # run from a source tree that was never installed
    __version__ = "0+unknown"
