"""Stored digests (idempotency keys, fingerprints) keep their bytes: ``digests.dumps`` is ``json.dumps``."""

import hashlib
import json

from hypothesis import given
from hypothesis import strategies as some

from treemail.domain import digests
from treemail.domain.commands import SendArguments, SendContext
from treemail.domain.decide import idempotency

# Every code point, lone surrogates and control characters included: a tool call id is whatever a model wrote.
ANY_TEXT = some.text(alphabet=some.characters(codec=None, categories=None))


@given(some.lists(ANY_TEXT, max_size=6))
def test_an_array_of_strings_is_written_as_the_standard_encoder_writes_it(items):
    assert digests.dumps(items) == json.dumps(items)


@given(some.lists(some.one_of(ANY_TEXT, some.none(), some.booleans(), some.integers()), max_size=6))
def test_an_array_of_anything_else_is_written_by_the_standard_encoder(items):
    assert digests.dumps(items) == json.dumps(items)


def test_keys_and_fingerprints_are_the_digests_stored_before():
    # What the records already kept were written under: sha256 of json.dumps, 32 hex characters.
    context = SendContext("sess-\u00e9", "run-1", "call \"7\"")
    arguments = SendArguments("explore_1a2b3c4d", "h\u00e9llo\n\u2603", "queue")
    before = lambda items: hashlib.sha256(json.dumps(items).encode()).hexdigest()[:32]  # noqa: E731
    assert idempotency.key_digest(context) == before(["sess-\u00e9", "run-1", "call \"7\""])
    assert idempotency.fingerprint(arguments) == before(["explore_1a2b3c4d", "h\u00e9llo\n\u2603", "queue"])
