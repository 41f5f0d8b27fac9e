"""The peer authorizer: context, read, send and control, each decided on its own. Pure.

A grant belongs to a (source, target) pair and is stored on the target's
stream (``PeerGrantSet``). The source is a session, or every session of an
agent type; a session's own grant replaces its type's whole (the most
specific wins, nothing is merged), so a host can narrow one session.
Everything is denied by default: no grant, no operation.

What each operation lets a source do to its target:

- ``context``: learn about it: the target's description, status and input
  schema appear in the source's peer tools;
- ``read``: inspect the status of what it sent there, and list that
  target's messages in its own peer inbox;
- ``send``: send to it over a route;
- ``control``: act on deliveries to it (retrying a parked delivery).

A reply is none of these: it is authorized by the message it answers (a
route back, and a message in the replier's inbox whose recorded sender is
that peer). Receiving a message grants nothing back: the recipient needs its
own route, and its own grant on the sender's stream to send, read or control
there.
"""

from dataclasses import dataclass

from . import limits
from .errors import Code, InvalidRequest, Rejected
from .peers import OPERATIONS, Grant, PeerState, source_key


@dataclass(frozen=True)
class Authorization:
    operation: str
    allowed: bool
    # The stable principal the source acts as toward this target; None when nothing is granted.
    principal: str | None = None


def grant_for(peers: PeerState, agent_type: str, session_id: str) -> Grant | None:
    return peers.grants.get(source_key("session", session_id)) or peers.grants.get(
        source_key("agent_type", agent_type)
    )


def authorize(peers: PeerState, agent_type: str, session_id: str, operation: str) -> Authorization:
    """May this source (its session id and agent type) do ``operation`` to the session holding ``peers``?"""
    if operation not in OPERATIONS:
        raise InvalidRequest(Code.PEER_INVALID_ARGUMENTS.value,
                             f"operation must be one of {', '.join(OPERATIONS)}, got {limits.shown(operation)}")
    grant = grant_for(peers, agent_type, session_id)
    if grant is None or not grant.allows(operation):
        return Authorization(operation, False)
    return Authorization(operation, True, grant.principal)


def require(peers: PeerState, agent_type: str, session_id: str, operation: str, peer: str) -> str:
    """The principal of an allowed operation; otherwise the stable refusal."""
    authorization = authorize(peers, agent_type, session_id, operation)
    if not authorization.allowed:
        raise Rejected(Code.PEER_NOT_GRANTED, f"permission denied: you hold no `{operation}` grant for peer `{peer}`")
    return authorization.principal
