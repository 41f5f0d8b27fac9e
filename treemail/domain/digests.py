"""Digests of JSON arrays: idempotency keys, argument fingerprints, notice keys.

They are stored (a retry finds its record by its key and is checked against its fingerprint), so their
bytes must never change: a digest is sha256 of ``json.dumps(items)`` in the standard encoder's default
form (", " between items, non-ASCII text as \\u escapes), as 32 hex characters. An array of strings,
what almost every key and fingerprint is, is written here with the C function ``json.dumps`` escapes
strings with, without the encoder's set-up on every call: half the cost, and two of them are taken for
every send a worker decides (BENCHMARKS.md).
"""

import hashlib
import json
from json.encoder import encode_basestring_ascii


def dumps(items: list) -> str:
    """``json.dumps(items)``, byte for byte."""
    if all(type(item) is str for item in items):
        return "[" + ", ".join(map(encode_basestring_ascii, items)) + "]"
    return json.dumps(items)


def digest(items: list) -> str:
    return hashlib.sha256(dumps(items).encode()).hexdigest()[:32]
