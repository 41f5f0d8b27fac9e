"""History rows for people: every event type reads as `key=value` fields, never a raw JSON object."""

import pytest

from treemail.domain import events as ev
from treemail.projections.render import history_row


@pytest.mark.parametrize("event,fields", [
    (ev.SessionRunStarted(run_id="run-1"), "run_id=run-1"),
    (ev.ProducerRegistered(producer_id="agent:abc", owner="agent", sender_session_id="abc"),
     "owner=agent sender_session_id=abc producer_id=agent:abc"),
    (ev.SessionWakeRequested(message_id=None), ""),
])
def test_an_event_without_its_own_row_prints_as_key_value_fields(event, fields):
    # given an event type render.py has no case for; when it is printed
    row = history_row(7, event)
    # then its fields follow the name, the way message rows read, and no JSON object appears
    assert row == f"{7:>6} {type(event).__name__:<26} {fields}".rstrip()
    assert "{" not in row


def test_a_message_events_row_says_why_after_its_id_and_run():
    expired = ev.ProducerMessageDiscarded(message_id="m-1", owner="agent", sender_session_id="s", reason="expired")
    assert history_row(3, expired) == f"{3:>6} {'ProducerMessageDiscarded':<26} m-1 reason=expired"
    released = ev.ProducerMessageReleased(message_id="m-2", owner="agent", run_id="r", reason="failed",
                                          detail="model crashed: out of memory", retry_at=12.5)
    assert history_row(4, released).endswith("m-2 run=r reason=failed retry_at=12.5 "
                                             "detail='model crashed: out of memory'")
    superseded = ev.ProducerMessageDiscarded(message_id="m-3", owner="agent", reason="superseded", superseded_by="m-4")
    assert history_row(5, superseded).endswith("m-3 reason=superseded superseded_by=m-4")
    assert history_row(6, ev.ProducerMessageClaimed(message_id="m-5", owner="agent", run_id="r")).endswith("m-5 run=r")


def test_a_field_with_spaces_is_quoted_so_the_row_still_splits_into_fields():
    row = history_row(1, ev.SessionRunStarted(run_id="run one"))
    assert row.endswith("run_id='run one'")


# ---- search pages ----------------------------------------------------------------------------------------


def test_search_pages_follow_their_cursor_to_every_match_even_when_times_tie():
    import pytest

    from treemail.domain import search

    # Twelve messages accepted within three instants: a page boundary falls inside a tie.
    rows = [{"message_id": f"m{i:02d}", "at": 100.0 + i // 4} for i in range(12)]
    rows.sort(key=lambda row: (row["at"], row["message_id"]), reverse=True)
    key = search.search_key("s-1", True, search.MailQuery(None, None, None, None, 5))
    seen, after = [], None
    while True:
        shown, more = search.page(rows, 5, after)
        seen += [row["message_id"] for row in shown]
        if not more:
            break
        after = search.position_of(search.cursor_after(shown[-1], key), key)
    assert seen == [f"m{i:02d}" for i in reversed(range(12))]
    # Paging by time alone would have lost the rest of the tie at the first page's end.
    first, _ = search.page(rows, 5, None)
    by_time = [row for row in rows if row["at"] < first[-1]["at"]]
    assert len(first) + len(by_time) < len(rows)
    with pytest.raises(ValueError):
        search.position_of("not-a-cursor", key)
