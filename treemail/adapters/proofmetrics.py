"""The source-proof failure counter, on the process's metrics registry.

Counted where delivery verifies proofs: the host process that claims mail.
``reason`` is bounded: ``missing``, ``unknown_key``, ``mismatch`` or ``unreadable``.
"""

from prometheus_client import Counter

from .metrics import HOST_REGISTRY

PROOF_FAILURES = Counter(
    "treemail_source_proof_failures",
    "Claimed messages whose source proof did not verify (altered after acceptance): set aside, never delivered",
    ["reason"],
    registry=HOST_REGISTRY,
)
