"""The source-proof keyring: from the ``[proof]`` table or a secret file, never from the streams.

    [proof]
    key_file = "/run/secrets/treemail-proof"   # or TREEMAIL_PROOF_KEY_FILE
    current_key = "2025-06"                    # optional: the key that signs (default: the file's first)

The file holds one key per line, ``<key id> <secret>`` (``#`` starts a
comment). The signing key is ``current_key`` or the first one; every key
listed verifies what it signed, so rotating is: put the new key first, keep
the old ones until the mail they signed is delivered. ``keys`` in the table
holds inline keys for tests and development. With no key at all, proofs are
off: messages carry none and deliveries report ``verified=False``. Every
worker and every host of a deployment must load the same keyring.
"""

import re
from pathlib import Path

from pydantic import BaseModel, ConfigDict, SecretStr

from ..domain.errors import ConfigError
from ..domain.proof import Keyring

KEY_ID = re.compile(r"^[A-Za-z0-9._-]{1,64}$")
MIN_SECRET_CHARS = 16


class ProofConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    key_file: str | None = None
    current_key: str | None = None
    # key id -> secret, inline (tests, development); a key file is the production way. Secret: a
    # printed or dumped configuration (logs, `config show`) never shows it.
    keys: dict[str, SecretStr] = {}


def _parse_file(path: str) -> list[tuple[str, str]]:
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"[proof] key_file {path} cannot be read: {exc.strerror or exc}") from None
    except UnicodeDecodeError as exc:
        raise ConfigError(f"[proof] key_file {path} is not UTF-8 text (byte {exc.start})") from None
    pairs = []
    for number, line in enumerate(text.splitlines(), start=1):
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        parts = line.split()
        if len(parts) != 2:
            raise ConfigError(f"[proof] key_file {path} line {number}: expected `<key id> <secret>`")
        pairs.append((parts[0], parts[1]))
    if not pairs:
        raise ConfigError(f"[proof] key_file {path} holds no key")
    return pairs


def load_keyring(config: ProofConfig) -> Keyring | None:
    """The keyring, None when no key is configured, or ConfigError naming what is wrong."""
    pairs = [(key_id, secret.get_secret_value()) for key_id, secret in config.keys.items()]
    if config.key_file:
        pairs = _parse_file(config.key_file) + pairs
    if not pairs:
        if config.current_key:
            raise ConfigError("[proof] current_key is set but no key is configured (key_file or keys)")
        return None
    keys: dict[str, bytes] = {}
    for key_id, secret in pairs:
        if not KEY_ID.match(key_id):
            raise ConfigError(f"[proof] key id {key_id!r}: use 1-64 letters, digits, '.', '_' or '-'")
        if len(secret) < MIN_SECRET_CHARS:
            raise ConfigError(f"[proof] key {key_id!r}: the secret must be at least {MIN_SECRET_CHARS} characters")
        if key_id in keys:
            raise ConfigError(f"[proof] key {key_id!r} is listed twice")
        keys[key_id] = secret.encode()
    current = config.current_key or pairs[0][0]
    if current not in keys:
        raise ConfigError(f"[proof] current_key {current!r} is not among the configured keys")
    return Keyring(current, keys)
