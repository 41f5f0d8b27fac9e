"""The host API engines embed: ``from treemail.host import Treemail, SendContext``.

The facade lives with the other producers (``treemail.producers.host``); this
module is its public address.
"""

from treemail.producers.host import Delivery, Disposed, Registration, SendContext, Treemail, Wake

__all__ = ["Treemail", "SendContext", "Registration", "Delivery", "Wake", "Disposed"]
