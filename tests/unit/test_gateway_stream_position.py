"""An event stream's position: what its events' ids say, and what a reconnect names in Last-Event-ID."""

import pytest

from treemail.domain import limits
from treemail.entrypoints import gatewaywire
from treemail.entrypoints.gatewaywire import Sent, parse_position, position_text


def test_each_event_id_is_the_position_after_it_per_partition():
    sent = Sent({})
    assert sent.add(2, "1700-0") == "2:1700-0"
    assert sent.add(0, "1800-3") == "0:1800-3,2:1700-0"
    # A trigger claimed from a dead runner may be older than what was sent: the position does not go back.
    assert sent.add(2, "1600-0") == "0:1800-3,2:1700-0"
    assert parse_position("0:1800-3,2:1700-0", partitions=4) == {0: "1800-3", 2: "1700-0"}
    assert parse_position(position_text({3: "9-9", 1: "10-0"}), partitions=4) == {1: "10-0", 3: "9-9"}


def test_a_trigger_sent_once_is_not_sent_again_on_the_same_stream():
    sent = Sent({1: "50-0"})
    assert sent.add(1, "60-0") == "1:60-0"
    assert sent.add(1, "60-0") is None  # its own, unacknowledged, claimed again
    assert sent.add(1, "40-0") == "1:60-0"  # another runner's, never sent here


def test_it_remembers_a_bounded_number_of_triggers(monkeypatch):
    monkeypatch.setattr(gatewaywire, "SENT_REMEMBERED", 2)
    sent = Sent({})
    for entry in ("1-0", "2-0", "3-0"):
        assert sent.add(0, entry) is not None
    assert sent.add(0, "3-0") is None
    assert sent.add(0, "1-0") is not None  # forgotten: sent again (wakeRun then answers false and acknowledges)


@pytest.mark.parametrize("text", ["x", "0:abc", "4:1-0", "0-1-0", "0:1-0,2", "-1:1-0",
                                  "0:99999999999999999999999-0", f"0:1-{2 ** 64}", "9" * 5000 + ":1-0"])
def test_a_position_this_gateway_did_not_write_is_refused(text):
    with pytest.raises(ValueError):
        parse_position(text, partitions=4)


def test_no_last_event_id_is_the_start():
    assert parse_position("", partitions=4) == {}


def test_an_entry_id_is_two_unsigned_64_bit_numbers():
    assert limits.is_entry_id("1712345678901-0") and limits.is_entry_id(f"{2 ** 64 - 1}-{2 ** 64 - 1}")
    for text in ("", "abc", "1-", "-1", "1-0-0", f"{2 ** 64}-0", "99999999999999999999999-0", "１-0", " 1-0", "1-0\n"):
        assert not limits.is_entry_id(text), text
