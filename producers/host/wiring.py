"""The host's bootstrap: its services first (``services/bootstrap.py``), then its parts over them.

Each part is built once and given services, or a part built before it, never
a method of the facade: ``Treemail`` only holds what is built here and hands
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
    reader = s.reader
    views = Views(reader, config, s.peers)
    permissions = Permissions(config, reader, s.sessions, s.approvals)
    sending = Sending(config, reader, permissions, s.approval_wait)
    deliveries = Deliveries(config, reader, s.sessions, views, s.peers, s.keyring)
    history = History(reader, s.sessions, s.drains, s.subscriptions)
    # Whole subtrees: the broadcast reads as mail (``tm.peers``), the cascading stop as disposal.
    subtree = Subtree(reader, s.subtree, s.disposal, sending, config)
    peers = Peers(reader, views, s.peers, s.peer_driver, subtree=subtree)
    interrupts = Interrupts(views, s.interrupts, s.triggers, s.settlement)
    obligations = Obligations(config, reader, s.sessions, s.obligations, s.disposal, clock, peers=s.peers,
                              peer_driver=s.peer_driver)
    mailbox = Mailbox(reader, s.sessions, deliveries, config.messaging.attempt_timeout_s)
    tools = Tools(config, reader, s.sessions, views, s.tokens, mailbox, ToolParts(
        sending=sending, interrupts=interrupts, obligations=obligations, peers=peers, history=history,
        subtree=subtree, reader=reader,
    ))
    return Host(s, sending, deliveries, history, peers, interrupts, Disposal(s.disposal, s.drains, subtree=subtree),
                permissions, obligations, tools)
