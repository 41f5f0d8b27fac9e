"""Configuration: the ``[messaging]`` contract table and the ``[service]`` table for operators.

Loaded from TOML, then overridden by environment variables
(``TREEMAIL_MESSAGING_<KEY>`` and ``TREEMAIL_SERVICE_<KEY>``; ``REDIS_URL`` for
the server). Unknown keys fail at load: a misspelt guard must never silently
fall back to its default.
"""

import os
import tomllib
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from ..domain.errors import ConfigError
from ..domain.messaging import MessagingConfig


class ServiceConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    redis_url: str | None = None
    # A Redis/Valkey Cluster: redis_url names any one node. Every atomic step
    # already touches one hash slot; this switches the clients and the reads
    # that would span slots.
    cluster: bool = False
    # "fast": success once the event is in the server's memory (and its AOF
    # buffer). "durable": success only after WAITAOF confirms the local fsync.
    profile: Literal["fast", "durable"] = "fast"
    # Hash-tag partitions of trees; fixed for the life of a deployment.
    partitions: int = Field(default=16, ge=1, le=16384)
    command_streams: int = Field(default=4, ge=1, le=1024)
    batch_size: int = Field(default=100, ge=1, le=10000)
    # A command pending this long in a consumer's list is reclaimed by another worker.
    reclaim_idle_ms: int = Field(default=15000, ge=10)
    # A command delivered more often than this is set aside in the dead-letter stream.
    max_deliveries: int = Field(default=5, ge=1)
    # A producer waits this long for a decision before answering engine_shutdown.
    decision_timeout_s: float = Field(default=30.0, gt=0)
    # A send waiting on a person (an `ask` rule) answers send_message:approval_timeout after this long.
    approval_timeout_s: float = Field(default=600.0, gt=0)
    idempotency_ttl_s: int = Field(default=7 * 24 * 3600, ge=60)
    connect_attempts: int = Field(default=5, ge=1)
    # The partition feeds projections follow are trimmed to about this many
    # entries; a projection that falls further behind rebuilds from the streams.
    feed_maxlen: int = Field(default=1_000_000, ge=1000)


class Config(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    messaging: MessagingConfig = MessagingConfig()
    service: ServiceConfig = ServiceConfig()


_ENV_PREFIXES = {"messaging": "TREEMAIL_MESSAGING_", "service": "TREEMAIL_SERVICE_"}


def _env_overrides(environ: dict[str, str]) -> dict[str, dict[str, Any]]:
    tables: dict[str, dict[str, Any]] = {"messaging": {}, "service": {}}
    for table, prefix in _ENV_PREFIXES.items():
        for name, value in environ.items():
            if name.startswith(prefix):
                tables[table][name[len(prefix):].lower()] = value
    if environ.get("REDIS_URL"):
        tables["service"]["redis_url"] = environ["REDIS_URL"]
    return tables


def _describe(error: ValidationError) -> str:
    parts = []
    for item in error.errors():
        where = ".".join(str(p) for p in item["loc"])
        if item["type"] == "extra_forbidden":
            parts.append(f"unknown key `{where}`")
        else:
            parts.append(f"`{where}`: {item['msg']}")
    return "; ".join(parts)


def load_config(path: str | Path | None = None, environ: dict[str, str] | None = None) -> Config:
    """Read TOML (if given or ``TREEMAIL_CONFIG`` is set), apply environment overrides, validate."""
    environ = dict(os.environ if environ is None else environ)
    path = path or environ.get("TREEMAIL_CONFIG")
    raw: dict[str, Any] = {}
    if path:
        try:
            # TOML is UTF-8 by definition, whatever the locale.
            raw = tomllib.loads(Path(path).read_text(encoding="utf-8"))
        except FileNotFoundError:
            raise ConfigError(f"config file {path} does not exist") from None
        except OSError as exc:
            raise ConfigError(f"config file {path} cannot be read: {exc.strerror or exc}") from None
        except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
            raise ConfigError(f"config file {path} is not valid TOML: {exc}") from None
    for table, values in _env_overrides(environ).items():
        if values:
            if not isinstance(raw.get(table, {}), dict):
                raise ConfigError(f"config file {path}: `{table}` must be a table ([{table}])")
            merged = dict(raw.get(table) or {})
            merged.update(values)
            raw[table] = merged
    try:
        return Config.model_validate(raw)
    except ValidationError as exc:
        source = f"config file {path}" if path else "configuration"
        raise ConfigError(f"invalid {source}: {_describe(exc)}") from None
