"""What becomes of each command of a send round, from its decision alone (``sendfate``): given a decision
and whether it was decided on held states, its fate."""

from treemail.domain import events as ev
from treemail.domain.decide.guards import NoSuchSession
from treemail.domain.decide.send import Accepted, AwaitsApproval, Refused, Replayed
from treemail.domain.errors import Code
from treemail.domain.outbound import Source
from treemail.domain.records import SessionRecord
from treemail.domain.state import SessionState
from treemail.services.sendfate import Fate, fate_of


def session(session_id: str) -> SessionRecord:
    return SessionRecord(session_id=session_id, root_session_id="root", parent_session_id=None,
                         agent_type="explore", description="", handle=None, rules=[("*", "allow")],
                         send_message_tool=True, partition=0)


SENDER, TARGET = session("sender"), session("target")
RECEIPT = Source(SENDER, SessionState(), 1, [ev.SessionStatusChanged(status="running")])
ACCEPTED = Accepted(events=[], result={}, sources=[RECEIPT])
INBOX_FULL = Refused(Code.INBOX_FULL, "full", sources=[RECEIPT])
DISABLED = Refused(Code.DISABLED, "off")
CONFLICT = Refused(Code.IDEMPOTENCY_CONFLICT, "conflict")
LOOP = Refused(Code.LOOP_DETECTED, "loop", ancestor_wanted=True)
REQUEST = AwaitsApproval(events=[ev.SessionStatusChanged(status="running")], request_id="r", label="sibling")
WAITING = AwaitsApproval(events=[], request_id="r", label="sibling")


def test_on_a_fresh_read_each_decision_goes_its_own_way():
    fates = {name: fate_of(decision, SENDER, TARGET, on_held=False) for name, decision in [
        ("accepted", ACCEPTED), ("inbox full", INBOX_FULL), ("disabled", DISABLED), ("conflict", CONFLICT),
        ("loop", LOOP), ("request", REQUEST), ("waiting", WAITING), ("replayed", Replayed({"ok": {}}))]}
    assert fates == {"accepted": Fate.APPENDED, "inbox full": Fate.APPENDED, "disabled": Fate.RECORDED_ALONE,
                     "conflict": Fate.ANSWERED, "loop": Fate.AGAIN, "request": Fate.APPENDED,
                     "waiting": Fate.ANSWERED, "replayed": Fate.ANSWERED}


def test_on_held_states_only_a_decision_its_append_checks_whole_is_kept():
    assert fate_of(ACCEPTED, SENDER, TARGET, on_held=True) is Fate.APPENDED
    assert fate_of(INBOX_FULL, SENDER, TARGET, on_held=True) is Fate.APPENDED
    assert fate_of(LOOP, SENDER, TARGET, on_held=True) is Fate.AGAIN
    for unchecked in (DISABLED, CONFLICT, REQUEST, WAITING, Replayed({"ok": {}}),
                      Accepted(events=[], result={})):  # no receipt: the sender's state goes unchecked
        assert fate_of(unchecked, SENDER, TARGET, on_held=True) is Fate.DISCARD, unchecked


def test_a_send_to_itself_is_checked_by_its_own_append_and_an_unknown_sender_never_is():
    assert fate_of(Accepted(events=[], result={}), SENDER, SENDER, on_held=True) is Fate.APPENDED
    assert fate_of(ACCEPTED, None, NoSuchSession("x"), on_held=True) is Fate.DISCARD
    assert fate_of(DISABLED, None, NoSuchSession("x"), on_held=False) is Fate.ANSWERED
