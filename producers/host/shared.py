"""The one shape of a host part's constructor: what every part shares first, then what is its own.

Every part reads sessions (``SessionReader``), most run commands on one
session (``SessionService``) or build a tool's definition (``Views``), and
all are configured alike; the bootstrap (``wiring.py``) builds these once and
hands the same ``Shared`` to each part.
"""

from dataclasses import dataclass

from treemail.adapters.config import Config
from treemail.services.clock import Clock
from treemail.services.sessionreader import SessionReader
from treemail.services.sessions import SessionService

from ..tools.table import Views


@dataclass(frozen=True)
class Shared:
    config: Config
    # Every read of a session.
    reader: SessionReader
    # Every command on one session (its decision and its one write).
    sessions: SessionService
    # What a session's tools are defined over.
    views: Views
    # What the host's decisions and deadlines are read by.
    clock: Clock


class Part:
    """A host part: ``Shared`` first, as ``_config``, ``_reader``, ``_sessions``, ``_views`` and ``_clock``."""

    def __init__(self, shared: Shared) -> None:
        self._config = shared.config
        self._reader = shared.reader
        self._sessions = shared.sessions
        self._views = shared.views
        self._clock = shared.clock
