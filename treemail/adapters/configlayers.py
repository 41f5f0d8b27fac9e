"""Where configuration comes from: the files (layers) and the environment, read but not yet validated.

Files, lowest layer first:

- given explicitly (``load_config(paths=[...])``, ``--config``, or
  ``TREEMAIL_CONFIG``; several paths separated by ``:``): each must exist;
- otherwise the default layers, each skipped when absent: system
  ``/etc/treemail/treemail.toml``, user ``$XDG_CONFIG_HOME/treemail/treemail.toml``
  (``~/.config/...`` without XDG_CONFIG_HOME), workspace ``./treemail.toml``.

The environment is read with pydantic-settings (prefix ``TREEMAIL_``, the
table and the key after it, ``REDIS_URL`` for the server); each value is then
parsed as its key's type, strictly, so ``"1"`` is never a boolean.
"""

import os
import re
import tomllib
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field
from pydantic_settings import BaseSettings, EnvSettingsSource, SettingsConfigDict
from pydantic_settings.sources.utils import parse_env_vars

from ..domain.errors import ConfigError

SYSTEM_FILE = Path("/etc/treemail/treemail.toml")
WORKSPACE_FILE = Path("treemail.toml")
KNOWN_TABLES = ("messaging", "service", "proof")


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


def read_layers(located: list[tuple[str, Path, bool]]) -> list[Layer]:
    layers = []
    for label, path, required in located:
        try:
            # TOML is UTF-8 by definition, whatever the locale.
            raw = tomllib.loads(path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            if required:
                raise ConfigError(f"{label} does not exist") from None
            continue
        except OSError as exc:
            raise ConfigError(f"{label} cannot be read: {exc.strerror or exc}") from None
        except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
            raise ConfigError(f"{label} is not valid TOML: {exc}") from None
        for name, table in raw.items():
            if name not in KNOWN_TABLES:
                raise ConfigError(f"{label}: unknown table `{name}` (known: {', '.join(KNOWN_TABLES)})")
            if not isinstance(table, dict):
                raise ConfigError(f"{label}: `{name}` must be a table ([{name}])")
        layers.append(Layer(label, path, raw))
    return layers


# ---- environment -------------------------------------------------------------------------------


class Environment(BaseSettings):
    """The raw environment overrides, as text: ``TREEMAIL_<TABLE>_<KEY>``, ``REDIS_URL``, ``TREEMAIL_CONFIG``."""

    model_config = SettingsConfigDict(
        env_prefix="TREEMAIL_", env_nested_delimiter="_", env_nested_max_split=1, case_sensitive=False,
        extra="ignore",
    )

    config: str | None = None
    messaging: dict[str, str] = {}
    service: dict[str, str] = {}
    proof: dict[str, str] = {}
    redis_url: str | None = Field(default=None, validation_alias="REDIS_URL")


class _MappingSource(EnvSettingsSource):
    """pydantic-settings' environment source over a given mapping (tests and callers pass their own)."""

    def __init__(self, settings_cls, environ: dict[str, str]) -> None:
        self._environ = environ
        super().__init__(settings_cls)

    def _load_env_vars(self):
        return parse_env_vars(self._environ, self.case_sensitive, self.env_ignore_empty, self.env_parse_none_str)


def read_environment(environ: dict[str, str]) -> Environment:
    try:
        return Environment.model_validate(_MappingSource(Environment, environ)())
    except Exception as exc:  # noqa: BLE001 - a malformed variable is a configuration error, not a crash
        raise ConfigError(f"invalid environment configuration: {exc}") from None


_INTEGER = re.compile(r"[+-]?(0|[1-9](_?[0-9])*)")
_FLOAT = re.compile(r"[+-]?(0|[1-9](_?[0-9])*)(\.[0-9](_?[0-9])*)?([eE][+-]?[0-9](_?[0-9])*)?")


def _accepts(annotation, kind: type) -> bool:
    if annotation is kind:
        return True
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        return any(_accepts(arg, kind) for arg in typing.get_args(annotation))
    return False


def parse_as(annotation, raw: str) -> Any:
    """An environment value as its key's TOML type; text that is not one is passed on as text, for the
    strict validation to refuse with the key's name."""
    if _accepts(annotation, str) or typing.get_origin(annotation) is typing.Literal:
        return raw
    text = raw.strip()
    if _accepts(annotation, bool):
        return {"true": True, "false": False}.get(text, raw)
    if _accepts(annotation, int) and _INTEGER.fullmatch(text):
        return int(text.replace("_", ""))
    if _accepts(annotation, float) and _FLOAT.fullmatch(text):
        return float(text.replace("_", ""))
    return raw


def typed_overrides(table: str, model: type[BaseModel], env: Environment) -> dict[str, tuple[str, Any]]:
    """key -> (variable, value) for every override of ``table``."""
    raw: dict[str, tuple[str, str]] = {
        key: (f"TREEMAIL_{table}_{key}".upper(), value) for key, value in getattr(env, table).items()
    }
    if table == "service" and env.redis_url:
        raw["redis_url"] = ("REDIS_URL", env.redis_url)
    out = {}
    for key, (variable, value) in raw.items():
        known = model.model_fields.get(key)
        out[key] = (variable, parse_as(known.annotation, value) if known else value)
    return out
