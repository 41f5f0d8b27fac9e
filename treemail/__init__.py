"""treemail: durable agent-to-agent mail for LLM agent delegation trees.

The one import surface for engine authors, the host API (``treemail.host``) and the protocol version:

    from treemail import Treemail, SendContext, Config, load_config
"""

from treemail import host
from treemail.domain.protocol import PROTOCOL_VERSION
from treemail.host import *  # noqa: F403 - the host API's names are this package's

__all__ = ["PROTOCOL_VERSION", *host.__all__]
