"""Each process's services, built once and given what they depend on: the floor its parts talk to.

One bootstrap per process kind, each building its services here first and
then its parts over them, downward only: the host (``host``, then
``producers/host/wiring.py``), the worker (``worker``, then
``consumers/app.py``), the delivery pump (``pump``, then
``consumers/pump.py``) and the projection runner (``projections``, then
``projections/service.py``). A reader finds every service a process has in
this file, and every part in that one.
"""

from dataclasses import dataclass

from ..adapters.commandclient import CommandClient
from ..adapters.config import Config
from ..adapters.connection import connect
from ..adapters.eventstore import EventStore
from ..adapters.proofkeys import load_keyring
from ..adapters.wakes import WakeReader, interrupt_reader
from ..domain.errors import InvalidRequest
from ..domain.proof import Keyring
from .approvals import ApprovalService, ApprovalWait
from .clock import SYSTEM_CLOCK, Clock
from .disposal import DisposalService
from .drains import DrainService
from .interrupts import InterruptService
from .obligations import ObligationService
from .peerdelivery import PeerDriver
from .peers import PeerService
from .sessionreader import SessionReader
from .sends import SendService
from .sessions import SessionService
from .settlement import SettlementService
from .subscriptions import Subscriptions
from .subtree import SubtreeService
from .tokens import TokenService
from .triggers import Triggers


@dataclass(frozen=True)
class HostServices:
    config: Config
    clock: Clock
    # Every read of a session the parts make.
    reader: SessionReader
    sessions: SessionService
    # The tree sends' commands to the worker pool, and the wait an `ask` rule adds.
    commands: CommandClient
    approval_wait: ApprovalWait
    approvals: ApprovalService
    triggers: Triggers
    subscriptions: Subscriptions
    tokens: TokenService
    interrupts: InterruptService
    obligations: ObligationService
    settlement: SettlementService
    disposal: DisposalService
    drains: DrainService
    keyring: Keyring | None
    peers: PeerService
    # Peer mail as an outbox: the host's driver makes each peer send's first admission attempt.
    peer_driver: PeerDriver
    # Whole subtrees: a broadcast's and a cascading stop's recorded steps.
    subtree: SubtreeService
    # Kept to set up the streams' groups at connect and to close the connections at the end.
    store: EventStore
    redis: object
    listener: object

    async def prepare(self) -> None:
        """The groups a host reads in: the command streams' and the wake streams'."""
        await self.store.ensure_command_group(self.config.service.command_streams)
        await self.store.ensure_wake_groups(self.config.service.partitions)

    async def close(self) -> None:
        """Pending sends are answered send_message:engine_shutdown; then the connections close."""
        await self.commands.close()
        await self.listener.aclose()
        await self.redis.aclose()


def decides_sends(config: Config) -> bool:
    """The host decides its sends itself (``[service] host_decides_sends``); never under the replicated profile,
    whose unconfirmed appends the workers answer (``not_replicated``)."""
    return config.service.host_decides_sends and config.service.profile != "replicated"


async def connections(config: Config, url: str | None) -> tuple[object, object]:
    """The host's two connections: one for requests, one for its blocking reads (answers, waits)."""
    url = url or config.service.redis_url
    if not url:
        raise InvalidRequest("config:no_server", "no Redis URL: set REDIS_URL or [service] redis_url")
    return await connect(url, config.service), await connect(url, config.service)


def host(redis, listener, config: Config, clock: Clock = SYSTEM_CLOCK) -> HostServices:
    """``clock``: what every service decides by (``treemail.testing`` passes one it can move forward)."""
    store = EventStore(redis, config.service)
    sessions = SessionService(store, config, clock)
    reader = SessionReader(store, listener)
    settlement = SettlementService(sessions)
    # Loaded once: a bad key file fails at connect, not at the first delivery.
    keyring = load_keyring(config.proof)
    disposal = DisposalService(store, sessions, settlement, clock)
    # The host decides its sends by the worker's own decision and commit when so configured; else the workers do.
    commands = CommandClient(redis, listener, config.service, store.directory,
                             SendService(store, config.messaging, keyring, clock) if decides_sends(config) else None)
    approvals = ApprovalService(redis, sessions, config.service.partitions)
    return HostServices(
        config=config, clock=clock, reader=reader, sessions=sessions, commands=commands,
        approval_wait=ApprovalWait(approvals, config.service, commands, clock),
        approvals=approvals,
        triggers=Triggers(WakeReader(redis, config.service), interrupt_reader(redis, config.service), reader),
        subscriptions=Subscriptions(redis, config.service, lambda: commands.closing),
        tokens=TokenService(redis, reader),
        interrupts=InterruptService(store, clock),
        obligations=ObligationService(sessions, clock, disposal),
        settlement=settlement,
        disposal=disposal,
        drains=DrainService(store, sessions),
        keyring=keyring,
        peers=PeerService(store, sessions, config.messaging, keyring, clock),
        peer_driver=PeerDriver(store, sessions, keyring, clock),
        subtree=SubtreeService(store, sessions, disposal, clock),
        store=store, redis=redis, listener=listener,
    )


@dataclass(frozen=True)
class WorkerServices:
    store: EventStore
    # The command batches' decisions and commits.
    decider: SendService


def worker(redis, config: Config, clock: Clock = SYSTEM_CLOCK) -> WorkerServices:
    store = EventStore(redis, config.service)
    return WorkerServices(store, SendService(store, config.messaging, load_keyring(config.proof), clock=clock))


@dataclass(frozen=True)
class PumpServices:
    # The delivery obligations' passes (``KeepObligations``).
    obligations: ObligationService
    # Peer mail as an outbox: the pump is also a peer driver (admission attempts, status back).
    peer_driver: PeerDriver


def pump(store: EventStore, config: Config, clock: Clock = SYSTEM_CLOCK) -> PumpServices:
    """Over ``store``: the pump's caller (``treemail.testing``, ``serve_pump``) holds the store it passes."""
    sessions = SessionService(store, config, clock)
    disposal = DisposalService(store, sessions, SettlementService(sessions), clock)
    return PumpServices(ObligationService(sessions, clock, disposal),
                        PeerDriver(store, SessionService(store, config, clock), load_keyring(config.proof), clock))


def projections(redis, config: Config) -> EventStore:
    """The projection runner folds the session streams through the store alone."""
    return EventStore(redis, config.service)
