"""What an HTTP agent's wait holds its request for (producers/mcp/leased.py): the client's wait, within 25 s."""

from treemail.producers.mcp.leased import MAX_HTTP_WAIT_S, http_wait_s
from treemail.producers.tools import receiving


def test_a_wait_over_http_is_the_clients_own_when_shorter_than_the_bound():
    assert http_wait_s(0.0) == 0.0
    assert http_wait_s(10.0) == 10.0


def test_a_longer_wait_ends_at_the_bound_under_common_30_s_read_timeouts():
    assert MAX_HTTP_WAIT_S == 25.0
    assert http_wait_s(receiving.parse(receiving.WAIT_FOR_MAIL, {})) == 25.0  # the tool's default, 30 s
    assert http_wait_s(receiving.parse(receiving.WAIT_FOR_MAIL, {"timeout_s": 60})) == 25.0


def test_a_null_timeout_is_the_default_as_every_absent_optional_argument_is():
    assert receiving.parse(receiving.WAIT_FOR_MAIL, {"timeout_s": None}) == receiving.parse(receiving.WAIT_FOR_MAIL, {})
    assert "error" in receiving.parse(receiving.WAIT_FOR_MAIL, {"timeout_s": "30"})
