"""The one place the host's services are built: each once, each given what it depends on.

The facade (``facade.py``) and its parts take what they need from here by
name, so a reader finds every dependency of the host in this file.
"""

from dataclasses import dataclass

import redis.asyncio as aioredis

from treemail.adapters.config import Config
from treemail.adapters.eventstore import EventStore
from treemail.adapters.proofkeys import load_keyring
from treemail.domain.proof import Keyring
from treemail.services.disposal import DisposalService
from treemail.services.drains import DrainService
from treemail.services.clock import SYSTEM_CLOCK, Clock
from treemail.services.interrupts import InterruptService
from treemail.services.obligations import ObligationService
from treemail.services.peerdelivery import PeerDriver
from treemail.services.peers import PeerService
from treemail.services.sends import SendService
from treemail.services.sessions import SessionService
from treemail.services.settlement import SettlementService
from treemail.services.subtree import SubtreeService

from ..client import CommandClient

from .interrupts import interrupt_reader
from .wakes import WakeReader


@dataclass(frozen=True)
class Services:
    config: Config
    redis: aioredis.Redis
    listener: aioredis.Redis
    store: EventStore
    sessions: SessionService
    commands: CommandClient
    wake_reader: WakeReader
    interrupt_reader: WakeReader
    interrupts: InterruptService
    obligations: ObligationService
    settlement: SettlementService
    disposal: DisposalService
    drains: DrainService
    keyring: Keyring | None
    peers: PeerService
    # Peer mail as an outbox: the host's driver makes each peer send's first admission attempt.
    peer_driver: PeerDriver
    clock: Clock
    # Whole subtrees: a broadcast's and a cascading stop's recorded steps.
    subtree: SubtreeService


def decides_sends(config: Config) -> bool:
    """The host decides its sends itself (``[service] host_decides_sends``); never under the replicated profile,
    whose unconfirmed appends the workers answer (``not_replicated``)."""
    return config.service.host_decides_sends and config.service.profile != "replicated"


def build(redis: aioredis.Redis, listener: aioredis.Redis, config: Config, clock: Clock = SYSTEM_CLOCK) -> Services:
    """``clock``: what every service decides by (``treemail.testing`` passes one it can move forward)."""
    store = EventStore(redis, config.service)
    sessions = SessionService(store, config, clock)
    settlement = SettlementService(sessions)
    # Loaded once: a bad key file fails at connect, not at the first delivery.
    keyring = load_keyring(config.proof)
    disposal = DisposalService(store, sessions, settlement, clock)
    return Services(
        config=config, redis=redis, listener=listener, store=store, sessions=sessions,
        commands=CommandClient(redis, listener, config.service, store.directory,
                               SendService(store, config.messaging, keyring, clock) if decides_sends(config) else None),
        wake_reader=WakeReader(redis, config.service),
        interrupt_reader=interrupt_reader(redis, config.service),
        interrupts=InterruptService(store, clock),
        obligations=ObligationService(sessions, clock),
        settlement=settlement,
        disposal=disposal,
        drains=DrainService(store, sessions),
        keyring=keyring,
        peers=PeerService(store, sessions, config.messaging, keyring, clock),
        peer_driver=PeerDriver(store, sessions, keyring, clock),
        clock=clock,
        subtree=SubtreeService(store, sessions, disposal, clock),
    )
