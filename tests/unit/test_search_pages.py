"""Search pages: a cursor continues the search that gave it, and only that one. Pure."""

import pytest

from treemail.domain import search
from treemail.domain.search import MailQuery

ROWS = [{"at": at, "message_id": mid} for at, mid in ((3.0, "c"), (2.0, "b2"), (2.0, "b1"), (1.0, "a"))]


def test_pages_follow_one_another_newest_first_with_ties_broken_by_message_id():
    key = search.search_key("s1", True, MailQuery())
    first, more = search.page(ROWS, 2, None)
    assert [r["message_id"] for r in first] == ["c", "b2"] and more
    after = search.position_of(search.cursor_after(first[-1], key), key)
    second, more = search.page(ROWS, 2, after)
    assert [r["message_id"] for r in second] == ["b1", "a"] and not more


@pytest.mark.parametrize("other", [
    ("s2", True, MailQuery()),                 # another session's search
    ("s1", False, MailQuery()),                # the tree's, not its own mail
    ("s1", True, MailQuery(text="x")),         # other criteria
])
def test_a_cursor_is_refused_by_any_other_search(other):
    cursor = search.cursor_after(ROWS[0], search.search_key("s1", True, MailQuery()))
    with pytest.raises(ValueError, match="another search"):
        search.position_of(cursor, search.search_key(*other))
    # The page size is no criterion: it may change from page to page; nor how a criterion is written.
    assert search.search_key("s1", True, MailQuery(limit=5)) == search.search_key("s1", True, MailQuery(limit=9))
    assert search.search_key("s1", True, MailQuery(text="Cache ", since=1)) == (
        search.search_key("s1", True, MailQuery(text="cache", since=1.0)))


@pytest.mark.parametrize("cursor", ["", "x" * (search.MAX_CURSOR_CHARS + 1), 7])
def test_a_cursor_is_bounded_text(cursor):
    with pytest.raises(ValueError, match="cursor"):
        search.checked(MailQuery(cursor=cursor))


@pytest.mark.parametrize("cursor", ["not-a-cursor", "W10", "WzEsMiwzLDRd"])
def test_a_cursor_that_is_no_page_of_any_search_is_refused(cursor):
    with pytest.raises(ValueError, match="cursor"):
        search.position_of(cursor, "k")
