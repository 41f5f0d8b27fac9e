"""Identifiers: UUIDv7 ids and tree-unique handles."""

import uuid

from hypothesis import given, settings
from hypothesis import strategies as some

from treemail.domain.ids import AGENT_TYPE_SLUG_MAX, HANDLE_PATTERN, agent_type_slug, is_uuid, new_handle, uuid7


def test_uuid7_is_a_version_7_rfc_uuid():
    for _ in range(1000):
        text = uuid7()
        value = uuid.UUID(text)
        assert value.version == 7
        assert value.variant == uuid.RFC_4122
        assert str(value) == text  # the canonical form: lower case, hyphens where uuid.UUID puts them
        assert is_uuid(text)


def test_uuid7_sorts_by_creation_time_across_milliseconds():
    import time

    first = uuid7()
    time.sleep(0.002)
    assert uuid7() > first


def test_is_uuid_is_exact():
    assert is_uuid("0190a000-0000-7000-8000-000000000001")
    assert not is_uuid("0190a000-0000-7000-8000-00000000000")  # one digit short: no prefix matching
    assert not is_uuid("explore_1a2b3c4d")


def test_slug_is_capped_at_sixteen_characters():
    assert AGENT_TYPE_SLUG_MAX == 16
    assert agent_type_slug("a" * 40) == "a" * 16
    assert agent_type_slug("code-reviewer-extraordinaire") == "code-reviewer-ex"
    # a cut that ends on a separator never leaves a trailing hyphen
    assert agent_type_slug("abcdefghijklmno pqr") == "abcdefghijklmno"


def test_slug_normalizes_and_is_never_empty():
    assert agent_type_slug("Code Reviewer") == "code-reviewer"
    assert agent_type_slug("--Explore__Agent--") == "explore-agent"
    assert agent_type_slug("") == "agent"
    assert agent_type_slug("日本語") == "agent"


def test_handles_are_random_per_call():
    assert new_handle("explore") != new_handle("explore")


@settings(max_examples=300)
@given(some.text())
def test_generated_handles_always_match_the_handle_pattern(agent_type):
    handle = new_handle(agent_type)
    assert HANDLE_PATTERN.match(handle), handle
    assert len(agent_type_slug(agent_type)) <= AGENT_TYPE_SLUG_MAX


@settings(max_examples=200)
@given(some.text(alphabet=some.sampled_from("aZ9-_ .é\u0130\u212a"), max_size=40))
def test_generated_handles_match_for_separator_heavy_agent_types(agent_type):
    assert HANDLE_PATTERN.match(new_handle(agent_type))
