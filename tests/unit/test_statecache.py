from treemail.adapters.statecache import Loaded, StateCache
from treemail.domain.state import SessionState


def test_a_state_is_given_only_for_the_etag_it_was_held_under():
    cache = StateCache()
    state = SessionState(status="running")
    cache.put("s-1", Loaded(state, 1, "e1"))

    assert cache.get("s-1", "e1") is state
    assert cache.get("s-1", "e2") is None
    assert cache.get("s-2", "e1") is None


def test_a_session_without_an_etag_is_never_given_from_the_cache():
    cache = StateCache()
    cache.put("s-1", Loaded(SessionState(), 0, ""))

    assert cache.get("s-1", "") is None


def test_the_cache_keeps_at_most_its_limit_dropping_the_session_written_longest_ago():
    cache = StateCache(limit=2)
    for sid in ("a", "b", "c"):
        cache.put(sid, Loaded(SessionState(), 1, "e"))
    cache.put("b", Loaded(SessionState(), 2, "e2"))
    cache.put("d", Loaded(SessionState(), 1, "e"))

    assert len(cache) == 2
    assert cache.get("b", "e2") is not None and cache.get("d", "e") is not None
