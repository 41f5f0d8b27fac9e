import dataclasses

import pytest

from treemail.domain import peers
from treemail.domain.frozen import replace
from treemail.domain.state import MailItem, SessionState

ITEM = MailItem(message_id="m", owner="agent", sender_session_id="s", agent_hop=1, mode="queue", state="accepted",
                run_id=None, seq=3)
STATE = SessionState(registered=True, status="running", pair_inflight={"s": 1}, producers=("p",))


@pytest.mark.parametrize("obj, changes", [
    (STATE, {"status": "idle", "pending_all": 2}),
    (STATE, {}),
    (ITEM, {"state": "claimed", "attempts": 1, "run_id": "r"}),
    (peers.EMPTY, {"inbox": ()}),
])
def test_the_copy_equals_what_dataclasses_replace_makes(obj, changes):
    copy = replace(obj, **changes)

    assert copy == dataclasses.replace(obj, **changes)
    assert type(copy) is type(obj) and copy is not obj


def test_the_original_is_left_as_it_was():
    replace(STATE, status="idle")

    assert STATE.status == "running"


def test_an_unknown_field_is_refused_as_dataclasses_replace_refuses_it():
    with pytest.raises(TypeError, match="no field 'stauts'"):
        replace(STATE, stauts="idle")


def test_the_copy_stays_frozen():
    with pytest.raises(dataclasses.FrozenInstanceError):
        replace(STATE, status="idle").status = "x"


def test_a_dataclass_with_post_init_is_refused():
    @dataclasses.dataclass(frozen=True)
    class Checked:
        value: int

        def __post_init__(self) -> None:
            assert self.value >= 0

    with pytest.raises(TypeError, match="not a plain dataclass"):
        replace(Checked(1), value=-1)
