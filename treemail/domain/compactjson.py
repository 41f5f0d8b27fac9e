"""Compact JSON for what treemail writes on every append: snapshots, mail items, records, answers.

orjson, not the standard library: encoding these was an eighth of a worker's
CPU (BENCHMARKS.md). The values read back the same; non-ASCII text
is written as UTF-8 rather than as ``\\u`` escapes. Digests (idempotency keys,
fingerprints) keep the standard encoder: their bytes must never change.
"""

import orjson


def dumps(value) -> str:
    return orjson.dumps(value).decode()
