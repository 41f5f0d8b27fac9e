"""The protocol version: what every stream entry and command carries (`v`), and how a reader treats one. Pure.

Changes within the protocol are additive (new optional fields, new event
types), so a reader accepts every version up to its own; an entry without a
`v` predates versioning (protocol 1, the first release) and is read like any older one. A
version newer than the reader's may carry what the reader cannot honour: it
refuses it with ``NewerProtocol`` (a worker dead-letters such a command with
that reason; readers of streams skip the entry and report it).
"""

from .errors import TreemailError

# Bumped for an incompatible change (the protocol-schema test says when). 6: a feed entry names a whole step.
# 7: a send command may ask for its number (`n`); SessionAnnounced (a child given its task directly); a peer
# intent's code version; a peer admission can be refused for a full peer inbox (peer_message:inbox_full); a
# cascading stop seals each session it reaches (SessionSealed): closed for good, no new children; decisions
# name their parties (superseded_by, a step that claimed nothing, every cancel answer).
PROTOCOL_VERSION = 7

# Entries written before the version was recorded on them: the first release's.
UNVERSIONED = 1


class NewerProtocol(TreemailError, ValueError):
    """An entry or command from a newer treemail than this reader (a ValueError: the CLI prints it as
    one line, no traceback)."""

    code = "protocol:newer"

    def __init__(self, version: int, what: str) -> None:
        super().__init__(
            f"{what} was written by treemail protocol {version}; this treemail reads protocol "
            f"{PROTOCOL_VERSION} and older: upgrade it"
        )
        self.version = version


def version_of(raw) -> int:
    """The `v` of an entry or command (bytes, str, int or absent); a malformed one is treated as newest,
    so it is refused rather than misread."""
    if raw is None:
        return UNVERSIONED
    try:
        return int(raw)
    except (TypeError, ValueError):
        return 1 << 30


def is_newer(version: int) -> bool:
    return version > PROTOCOL_VERSION


def require_known(raw, what: str) -> int:
    version = version_of(raw)
    if is_newer(version):
        raise NewerProtocol(version, what)
    return version
