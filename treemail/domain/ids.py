"""Identifiers: UUIDv7 session and message ids, tree-unique handles."""

import os
import re
import time

HANDLE_PATTERN = re.compile(r"^[a-z0-9](?:[a-z0-9]|-(?=[a-z0-9])){0,15}_[0-9a-f]{8}$")
AGENT_TYPE_SLUG_MAX = 16
UUID_PATTERN = re.compile(
    r"^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$"
)


def uuid7() -> str:
    """A time-ordered UUID (RFC 9562 version 7): sorts by creation time in streams and logs."""
    # 48 bits of milliseconds, then 80 random bits of which version 7 (4 bits) and variant 0b10 (2 bits)
    # take their places. Formatted here rather than through uuid.UUID, which costs more (one id per send).
    raw = bytearray((time.time_ns() // 1_000_000 & 0xFFFF_FFFF_FFFF).to_bytes(6, "big") + os.urandom(10))
    raw[6] = 0x70 | (raw[6] & 0x0F)
    raw[8] = 0x80 | (raw[8] & 0x3F)
    digits = raw.hex()
    return f"{digits[:8]}-{digits[8:12]}-{digits[12:16]}-{digits[16:20]}-{digits[20:]}"


def is_uuid(text: str) -> bool:
    return bool(UUID_PATTERN.match(text))


def agent_type_slug(agent_type: str) -> str:
    """Lower-case, hyphen-separated, at most 16 characters, never empty.

    The slug must satisfy HANDLE_PATTERN's prefix: no leading, trailing or doubled hyphens.
    """
    lowered = re.sub(r"[^a-z0-9]+", "-", agent_type.lower()).strip("-")
    slug = lowered[:AGENT_TYPE_SLUG_MAX].rstrip("-")
    return slug or "agent"


def new_handle(agent_type: str) -> str:
    return f"{agent_type_slug(agent_type)}_{os.urandom(4).hex()}"
