"""Configuration: the ``[messaging]`` contract table and the ``[service]`` table for operators.

Layers, lowest first (``configlayers.py`` finds and reads the files):

1. built-in defaults;
2. config files in order, each replacing a table it has *whole*: a table a
   higher file has takes, for every key it omits, the built-in default, never
   the lower file's value (system, user, workspace files by default, or the
   ``paths`` given / ``TREEMAIL_CONFIG``);
3. environment variables, key by key (read with pydantic-settings):
   ``TREEMAIL_MESSAGING_<KEY>``, ``TREEMAIL_SERVICE_<KEY>``, ``TREEMAIL_PROOF_<KEY>``, and ``REDIS_URL``.

Types are strict: every key takes only its own TOML type (no ``"32768"``,
``"false"``, ``1`` for a boolean, ``2.0`` or ``true`` for an integer; an
integer is a valid float). An environment value is parsed as its key's type
(``true``/``false``, an integer, a number, the text itself, or JSON for a
table such as ``TREEMAIL_PROOF_KEYS``) and fails the same way. Unknown keys and tables fail too: a misspelt guard must never
silently fall back to its default. Every failure names the key and where it
came from.
"""

import json
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, SecretStr, ValidationError

from ..domain.errors import ConfigError
from ..domain.messaging import MessagingConfig
from . import configlayers
from .configlayers import Layer
from .proofkeys import ProofConfig


class ServiceConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    redis_url: str | None = None
    # A Redis/Valkey Cluster: redis_url names any one node. Every atomic step
    # already touches one hash slot; this switches the clients and the reads
    # that would span slots.
    cluster: bool = False
    # "fast": success once the event is in the server's memory (and its AOF
    # buffer). "durable": success only after WAITAOF confirms the local fsync.
    # "replicated": success only after WAIT confirms the append on `min_replicas` replicas of the primary
    # that took it, so a failover to one of them keeps it.
    profile: Literal["fast", "durable", "replicated"] = "fast"
    # The replicated profile: how many replicas must have an append before it succeeds, and how long
    # to wait for them; past that the outcome is unknown (send_message:not_replicated) until a retry
    # of the same call resolves it from its idempotency record.
    min_replicas: int = Field(default=1, ge=1, le=16)
    replica_timeout_ms: int = Field(default=2000, ge=10, le=60_000)
    # Hash-tag partitions of trees; fixed for the life of a deployment.
    partitions: int = Field(default=16, ge=1, le=16384)
    command_streams: int = Field(default=4, ge=1, le=1024)
    batch_size: int = Field(default=100, ge=1, le=10000)
    # Batches of one command stream a worker decides at once on a stream it owns (streams shared: where no
    # other worker reads it): while one waits for the server, the next is read and decided (on the states
    # the first leaves, checked by etag like any other writer's).
    batches_in_flight: int = Field(default=2, ge=1, le=64)
    # Each command stream is read by one live worker at a time, the streams shared out evenly among the
    # live workers: workers that take turns at one stream's batches decide one sender's commands at once
    # and conflict on its record (BENCHMARKS.md). False: every worker reads every stream.
    exclusive_streams: bool = True
    # Which command stream a producer puts a send on. "tree": its sender's tree's (crc32 of the root's id), so
    # one worker decides a tree's mail both ways without conflicting with another on the sessions it shares
    # (BENCHMARKS.md). "sender": the sender's own, which spreads one very busy tree
    # over several workers, at the price of those conflicts.
    route_commands_by: Literal["tree", "sender"] = "tree"
    # A worker that has not said it is alive for this long is taken for dead: its streams go to the others.
    worker_timeout_ms: int = Field(default=5000, ge=100)
    # A command pending this long in a consumer's list is reclaimed by another worker.
    reclaim_idle_ms: int = Field(default=15000, ge=10)
    # A command delivered more often than this is set aside in the dead-letter stream.
    max_deliveries: int = Field(default=5, ge=1)
    # A producer waits this long for a decision before answering engine_shutdown.
    decision_timeout_s: float = Field(default=30.0, gt=0)
    # The host decides each send itself, by the decision and the commit script a worker runs (the same etags,
    # idempotency record and live-sender check), instead of publishing it for a worker: no command stream, no
    # worker and no reply list on a send's path (an MCP send at 0.73 of an empty tool's rate against 0.50).
    # A send it could not finish (a lost connection) goes to the workers, whose decision of it is the same.
    # Not under the replicated profile, nor for a traced send (its spans are the worker's).
    host_decides_sends: bool = False
    # A send waiting on a person (an `ask` rule) answers send_message:approval_timeout after this long.
    approval_timeout_s: float = Field(default=600.0, gt=0)
    # Deprecated, ignored: a tool call's outcome is now kept as long as the sender's
    # session (exactly once per tool call: a retry must never send twice). Accepted so
    # that existing files keep loading.
    idempotency_ttl_s: int = Field(default=7 * 24 * 3600, ge=60)
    connect_attempts: int = Field(default=5, ge=1)
    # The partition feeds projections follow are trimmed to about this many
    # entries; a projection that falls further behind rebuilds from the streams.
    feed_maxlen: int = Field(default=1_000_000, ge=1000)


class Config(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    messaging: MessagingConfig = MessagingConfig()
    service: ServiceConfig = ServiceConfig()
    # Source proof: the keyring that signs and verifies who sent a message (``proofkeys.py``)
    proof: ProofConfig = ProofConfig()


TABLES: dict[str, type[BaseModel]] = {"messaging": MessagingConfig, "service": ServiceConfig, "proof": ProofConfig}


@dataclass(frozen=True)
class Effective:
    """The configuration in force and where each part of it came from (for ``treemail config show``)."""

    config: Config
    layers: list[Layer]
    # table -> the layer it came from ("built-in defaults" or a file's label).
    table_sources: dict[str, str]
    # "table.key" -> the environment variable that set it.
    environment: dict[str, str]
    # Every file looked for, lowest layer first, found or not.
    searched: list[str]


_TOML_TYPES = {str: "a string", bool: "a boolean", int: "an integer", float: "a float", dict: "a table",
               list: "an array"}
_EXPECTED = {"bool_type": "must be true or false", "int_type": "must be an integer",
             "float_type": "must be a number", "string_type": "must be a string"}


def _kind(value: Any) -> str:
    return next((name for cls, name in _TOML_TYPES.items() if type(value) is cls), type(value).__name__)


def describe(error: ValidationError, table: str, source_of) -> str:
    """One clause per problem, each naming the key and where its value came from."""
    parts = []
    for item in error.errors():
        key = ".".join([table, *(str(p) for p in item["loc"])])
        where = source_of(".".join([table, *(str(p) for p in item["loc"][:1])]))  # a value within a key: the key's
        if item["type"] == "extra_forbidden":
            parts.append(f"{where}: unknown key `{key}`")
        elif item["type"] in _EXPECTED:
            got = item["input"]
            parts.append(f"{where}: `{key}` {_EXPECTED[item['type']]}, not {got!r} ({_kind(got)})")
        else:
            parts.append(f"{where}: `{key}`: {item['msg']}")
    return "; ".join(parts)


def validate_table(table: str, values: dict[str, Any], source_of) -> BaseModel:
    try:
        return TABLES[table].model_validate(values, strict=True)
    except ValidationError as exc:
        raise ConfigError(f"invalid configuration: {describe(exc, table, source_of)}") from None


def load_effective(
    path: str | Path | None = None,
    environ: dict[str, str] | None = None,
    *,
    paths: list[str | Path] | None = None,
) -> Effective:
    environ = dict(os.environ if environ is None else environ)
    env = configlayers.read_environment(environ, TABLES)
    located = configlayers.locate(path, paths, env.config, environ)
    layers = configlayers.read_layers(located, TABLES)
    tables: dict[str, BaseModel] = {}
    table_sources: dict[str, str] = {}
    environment: dict[str, str] = {}
    for table in TABLES:
        values: dict[str, Any] = {}
        table_sources[table] = "built-in defaults"
        for layer in layers:
            if table in layer.tables:
                # Each layer must be valid on its own, even one a higher layer replaces.
                validate_table(table, layer.tables[table], lambda key, layer=layer: layer.label)
                values = dict(layer.tables[table])
                table_sources[table] = layer.label
        for key, (variable, value) in env.overrides[table].items():
            values[key] = value
            environment[f"{table}.{key}"] = variable
        tables[table] = validate_table(
            table, values, lambda key: f"environment {environment[key]}" if key in environment else table_sources[table]
        )
    return Effective(Config(**tables), layers, table_sources, environment, [label for label, _, _ in located])


def load_config(
    path: str | Path | None = None,
    environ: dict[str, str] | None = None,
    *,
    paths: list[str | Path] | None = None,
) -> Config:
    """The configuration in force: ``paths`` (lowest layer first), else ``path``, else ``TREEMAIL_CONFIG``
    (several paths separated by ``:``), else the default layers; then the environment."""
    return load_effective(path, environ, paths=paths).config


def _toml_value(value: Any) -> str:
    if isinstance(value, SecretStr):
        return '"***"'
    if isinstance(value, dict) and value:
        return "{ " + ", ".join(f"{json.dumps(key)} = {_toml_value(item)}" for key, item in value.items()) + " }"
    if isinstance(value, dict):
        return "{}"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return json.dumps(value, ensure_ascii=False)  # a JSON string is a valid TOML basic string
    return repr(value)


def _redacted(url: str) -> str:
    """A server URL without its password: `config show` output gets pasted into tickets."""
    return re.sub(r"(://[^:/@]*:)[^@/]*@", r"\1***@", url)


def render_effective(effective: Effective) -> str:
    """What ``treemail config show`` prints: the configuration in force as TOML, each table with the
    layer it came from and each key an environment variable set with that variable."""
    found = {layer.label for layer in effective.layers}
    lines = ["# treemail configuration in force", "# layers, lowest first (a table in a higher layer replaces "
             "the lower one whole; keys it omits take the built-in defaults):"]
    lines += [f"#   {label}{'' if label in found else ' (absent)'}" for label in effective.searched]
    lines.append("#   environment (TREEMAIL_MESSAGING_<KEY>, TREEMAIL_SERVICE_<KEY>, TREEMAIL_PROOF_<KEY>, REDIS_URL), "
                 "key by key")
    for table in TABLES:
        lines += ["", f"[{table}]  # from {effective.table_sources[table]}"]
        for key, value in getattr(effective.config, table).model_dump().items():
            if value is None:
                lines.append(f"# {key} is not set")
                continue
            shown = _redacted(value) if key == "redis_url" else value
            variable = effective.environment.get(f"{table}.{key}")
            lines.append(f"{key} = {_toml_value(shown)}" + (f"  # environment {variable}" if variable else ""))
    return "\n".join(lines) + "\n"


def show_config(
    path: str | Path | None = None, environ: dict[str, str] | None = None, *, paths: list[str | Path] | None = None
) -> str:
    """``treemail config show``: load every layer, then render what is in force and where it came from."""
    return render_effective(load_effective(path, environ, paths=paths))
