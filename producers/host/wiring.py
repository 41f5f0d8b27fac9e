"""The host's bootstrap: its services first (``services/bootstrap.py``), then its parts over them.

Each part is built once and given what every part shares (``Shared``), then
its own services, or a part built before it, never a method of the facade: ``Treemail`` only holds what is built here and hands
its calls down. A reader finds every part of the host, and what it is given,
in this file.
"""

from dataclasses import dataclass

from treemail.adapters.config import Config
from treemail.services import bootstrap
from treemail.services.clock import SYSTEM_CLOCK, Clock
from treemail.services.bootstrap import HostServices

from ..tools.table import ToolParts, Views

from .delivery import Deliveries
from .disposal import Disposal
from .history import History
from .interrupts import Interrupts
from .mailbox import Mailbox
from .obligations import Obligations
from .peers import Peers
from .permissions import Permissions
from .sending import Sending
from .shared import Shared
from .subtree import Subtree
from .tools import Tools


@dataclass(frozen=True)
class Host:
    services: HostServices
    # Every tree send (a model's, the host's, a broadcast copy) goes out through this one part.
    sending: Sending
    deliveries: Deliveries
    history: History
    peers: Peers
    interrupts: Interrupts
    disposal: Disposal
    permissions: Permissions
    obligations: Obligations
    tools: Tools


def build(redis, listener, config: Config, clock: Clock = SYSTEM_CLOCK) -> Host:
    """Services, then parts, downward only. ``clock``: what every decision is dated by."""
    s = bootstrap.host(redis, listener, config, clock)
    shared = Shared(config, s.reader, s.sessions, Views(s.reader, config, s.peers), clock)
    permissions = Permissions(shared, s.approvals)
    sending = Sending(shared, permissions, s.approval_wait)
    deliveries = Deliveries(shared, s.peers, s.keyring)
    history = History(shared, s.drains, s.subscriptions)
    # Whole subtrees: the broadcast reads as mail (``tm.peers``), the cascading stop as disposal.
    subtree = Subtree(shared, s.subtree, s.disposal, sending)
    peers = Peers(shared, s.peers, s.peer_driver, subtree=subtree)
    interrupts = Interrupts(shared, s.interrupts, s.triggers, s.settlement)
    obligations = Obligations(shared, s.obligations, s.disposal, s.triggers, peers=s.peers, peer_driver=s.peer_driver)
    tools = Tools(shared, s.tokens, Mailbox(shared, deliveries), ToolParts(
        sending=sending, interrupts=interrupts, obligations=obligations, peers=peers, history=history,
        subtree=subtree, reader=s.reader,
    ))
    return Host(s, sending, deliveries, history, peers, interrupts, Disposal(s.disposal, s.drains, subtree=subtree),
                permissions, obligations, tools)
