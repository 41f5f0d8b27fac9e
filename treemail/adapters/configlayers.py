"""Where configuration comes from: the files (layers) and the environment, read by pydantic-settings' sources
but not yet validated.

Files, lowest layer first:

- given explicitly (``load_config(paths=[...])``, ``--config``, or
  ``TREEMAIL_CONFIG``; several paths separated by ``:``): each must exist;
- otherwise the default layers, each skipped when absent: system
  ``/etc/treemail/treemail.toml``, user ``$XDG_CONFIG_HOME/treemail/treemail.toml``
  (``~/.config/...`` without XDG_CONFIG_HOME), workspace ``./treemail.toml``.

Each file is read by a ``TomlConfigSettingsSource``. The environment is read by an ``EnvSettingsSource``
(prefix ``TREEMAIL_``, the table and the key after it; ``REDIS_URL`` for the server); a value is then read as
its key's TOML type (``true``, ``32_768``, ``2.5``; a table key such as ``[proof] keys`` takes JSON, as
pydantic-settings reads every structured value), so ``"1"`` is never a boolean.
"""

import os
import tomllib
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import BaseModel, create_model
from pydantic.fields import FieldInfo
from pydantic_settings import BaseSettings, EnvSettingsSource, SettingsConfigDict, TomlConfigSettingsSource
from pydantic_settings.sources.utils import parse_env_vars

from ..domain.errors import ConfigError

SYSTEM_FILE = Path("/etc/treemail/treemail.toml")
WORKSPACE_FILE = Path("treemail.toml")


@dataclass(frozen=True)
class Layer:
    label: str
    path: Path
    tables: dict[str, dict[str, Any]] = field(default_factory=dict)


def default_files(environ: dict[str, str]) -> list[tuple[str, Path]]:
    files = [("system", SYSTEM_FILE)]
    config_home = environ.get("XDG_CONFIG_HOME") or (
        str(Path(environ["HOME"]) / ".config") if environ.get("HOME") else None
    )
    if config_home:
        files.append(("user", Path(config_home) / "treemail" / "treemail.toml"))
    files.append(("workspace", WORKSPACE_FILE))
    return files


def _split(value: str | Path) -> list[Path]:
    if isinstance(value, Path):
        return [value]
    return [Path(part) for part in value.split(os.pathsep) if part]


def locate(path, paths, env_config: str | None, environ: dict[str, str]) -> list[tuple[str, Path, bool]]:
    """(label, path, required) of every layer, lowest first."""
    named = (
        [p for item in paths for p in _split(item)] if paths is not None
        else _split(path) if path
        else _split(env_config) if env_config
        else None
    )
    if named is not None:
        return [(f"config file {p}", p, True) for p in named]
    return [(f"{name} config file {p}", p, False) for name, p in default_files(environ)]


def read_layers(located: list[tuple[str, Path, bool]], tables: dict[str, type[BaseModel]]) -> list[Layer]:
    """Each file present, read on its own so that an error names it. Merged lowest first, a file's table
    replaces a lower file's whole, as pydantic-settings merges a list of TOML files."""
    schema = _schema(tables)
    layers = []
    for label, path, required in located:
        if not path.exists():
            if required:
                raise ConfigError(f"{label} does not exist")
            continue
        if not path.is_file():
            raise ConfigError(f"{label} cannot be read: not a file")
        try:
            raw = TomlConfigSettingsSource(schema, toml_file=path).toml_data
        except OSError as exc:
            raise ConfigError(f"{label} cannot be read: {exc.strerror or exc}") from None
        except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
            # TOML is UTF-8 by definition, whatever the locale.
            raise ConfigError(f"{label} is not valid TOML: {exc}") from None
        for name, table in raw.items():
            if name not in tables:
                raise ConfigError(f"{label}: unknown table `{name}` (known: {', '.join(tables)})")
            if not isinstance(table, dict):
                raise ConfigError(f"{label}: `{name}` must be a table ([{name}])")
        layers.append(Layer(label, path, raw))
    return layers


# ---- environment -------------------------------------------------------------------------------


class _Sources(BaseSettings):
    """What the environment may set: ``TREEMAIL_CONFIG`` and ``TREEMAIL_<TABLE>_<KEY>`` (the tables are added
    by ``_schema``). Never instantiated: its sources are called directly, and config.py validates."""

    model_config = SettingsConfigDict(
        env_prefix="TREEMAIL_", env_nested_delimiter="_", env_nested_max_split=1, case_sensitive=False,
        extra="ignore",
    )

    config: str | None = None


class _Server(BaseSettings):
    """``REDIS_URL``, the name every Redis tool reads, for ``[service] redis_url``."""

    model_config = SettingsConfigDict(case_sensitive=False, extra="ignore")

    redis_url: str | None = None


def _schema(tables: dict[str, type[BaseModel]]) -> type[BaseSettings]:
    """The tables as fields typed by their models: the source reads a nested key's type, and a table key
    (``[proof] keys``) as JSON, from them."""
    return create_model("TreemailSources", __base__=_Sources, **{name: (model, model()) for name, model in
                                                                  tables.items()})


def _accepts_text(annotation) -> bool:
    if annotation is str or typing.get_origin(annotation) is typing.Literal:
        return True
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        return any(_accepts_text(arg) for arg in typing.get_args(annotation))
    return False


def as_toml_value(known: FieldInfo | None, raw: str) -> Any:
    """An environment value read as its key's TOML type: ``true``, ``-1``, ``32_768``, ``2.5``. Text that is
    not a TOML value is passed on as text, for the strict validation to refuse naming the key."""
    if known is None or _accepts_text(known.annotation):
        return raw
    try:
        return tomllib.loads(f"value = {raw}")["value"]
    except tomllib.TOMLDecodeError:
        return raw


class _Environment(EnvSettingsSource):
    """pydantic-settings' environment source over a given mapping (tests and callers pass their own), each
    table's values read as their keys' TOML types."""

    def __init__(self, settings_cls, environ: dict[str, str]) -> None:
        self._environ = environ
        self._table: str | None = None  # the table being read, to name a variable in an error
        super().__init__(settings_cls)

    def _load_env_vars(self):
        return parse_env_vars(self._environ, self.case_sensitive, self.env_ignore_empty, self.env_parse_none_str)

    def explode_env_vars(self, field_name: str, field: FieldInfo, env_vars) -> dict[str, Any]:
        self._table = field_name
        try:
            exploded = super().explode_env_vars(field_name, field, env_vars)
        finally:
            self._table = None
        known = getattr(field.annotation, "model_fields", {})
        return {
            key: as_toml_value(known.get(key), value) if isinstance(value, str) else value
            for key, value in exploded.items()
        }

    def decode_complex_value(self, field_name: str, field: FieldInfo | None, value: Any) -> Any:
        try:
            return super().decode_complex_value(field_name, field, value)
        except ValueError:
            variable = "_".join(filter(None, ("TREEMAIL", self._table, field_name))).upper()
            raise ConfigError(f"invalid configuration: environment {variable} must be a JSON object") from None


@dataclass(frozen=True)
class Environment:
    config: str | None
    # table -> key -> (variable, value)
    overrides: dict[str, dict[str, tuple[str, Any]]]


def read_environment(environ: dict[str, str], tables: dict[str, type[BaseModel]]) -> Environment:
    try:
        read = _Environment(_schema(tables), environ)()
        redis_url = _Environment(_Server, environ)().get("redis_url")
    except ConfigError:
        raise
    except Exception as exc:  # noqa: BLE001 - a malformed variable is a configuration error, not a crash
        raise ConfigError(f"invalid environment configuration: {exc}") from None
    overrides = {}
    for table in tables:
        values = read.get(table) or {}
        if not isinstance(values, dict):
            raise ConfigError(f"invalid configuration: environment TREEMAIL_{table.upper()} must be a JSON object")
        overrides[table] = {key: (f"TREEMAIL_{table}_{key}".upper(), value) for key, value in values.items()}
    if redis_url:
        overrides["service"]["redis_url"] = ("REDIS_URL", redis_url)
    return Environment(read.get("config"), overrides)
