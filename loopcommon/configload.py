"""Loading a settings model: environment variables over a TOML file over the defaults.

loopd and brokerd load their settings here, so both read the same sources and report a problem in
the same words. A program's model is a pydantic-settings ``BaseSettings`` whose ``model_config``
gives the variable prefix and, for a nested table, the delimiter between the table and its keys:

- loopd: ``LOOPD_MODEL`` is ``model`` in the file, ``LOOPD_MM_URL`` is ``url`` in its ``[mm]``
  table (prefix ``LOOPD_``, delimiter ``_``);
- brokerd: ``BROKERD_BROKER__AUDIT_DB`` is ``audit_db`` in its ``[broker]`` table (delimiter
  ``__``).

The file is named by ``<PREFIX>CONFIG``. Every problem becomes one ``ConfigError`` line:

- ``unknown setting LOOPD_FIRST_BYTES_S; did you mean LOOPD_FIRST_BYTE_S?`` for a variable with the
  prefix that names no setting (pydantic-settings would ignore it, and the default would apply);
  the same for a key in the file (``unknown setting `modle` in /etc/loopd/loopd.toml; ...``);
- ``LOOPD_CONFIG: no such file: PATH``, ``LOOPD_CONFIG: PATH is a folder, not a file: ...``, or
  ``LOOPD_CONFIG: PATH: <why it is not TOML>``;
- ``<where>: <problem>`` for a bad value, where ``<where>`` is the variable when the environment
  set it, else the key in the file; several problems are joined with ``; `` on the one line;
- ``contradictory settings (<rule>): <problem>`` when values that are each valid contradict
  one another: the model checks its ``Rule``s in a model validator (``check_rules``).
"""

from __future__ import annotations

import difflib
import os
import types
import typing
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Generic, Protocol, TypeVar

from pydantic import BaseModel, ValidationError
from pydantic_core import ErrorDetails
from pydantic_settings import (
    BaseSettings,
    PydanticBaseSettingsSource,
    SettingsError,
    TomlConfigSettingsSource,
)

from loopcommon.errors import ConfigError

M = TypeVar("M")
M_contra = TypeVar("M_contra", contravariant=True)
S = TypeVar("S", bound=BaseSettings)


@dataclass(frozen=True)
class Naming:
    """How a model's settings are named outside the program: variables and file keys."""

    prefix: str  # "LOOPD_"
    delimiter: str  # between a nested table's name and its key in a variable name

    @classmethod
    def of(cls, model: type[BaseSettings]) -> Naming:
        config = model.model_config
        prefix, delimiter = config.get("env_prefix"), config.get("env_nested_delimiter")
        return cls(str(prefix or ""), str(delimiter or ""))

    @property
    def config_variable(self) -> str:
        return f"{self.prefix}CONFIG"

    def variable(self, path: Sequence[str]) -> str:
        return self.prefix + self.delimiter.join(part.upper() for part in path)

    @staticmethod
    def key(path: Sequence[str]) -> str:
        return ".".join(path)


@dataclass(frozen=True)
class Rule(Generic[M_contra]):
    """Settings that are each valid but contradict one another. ``problem`` returns one clause
    naming the settings and their values, or None when the rule holds."""

    name: str
    problem: Callable[[M_contra], str | None]


def check_rules(settings: M, rules: Iterable[Rule[M]]) -> None:
    """For a model validator (``mode="after"``): raise on the first rule ``settings`` break."""
    for rule in rules:
        if (problem := rule.problem(settings)) is not None:
            raise ValueError(f"contradictory settings ({rule.name}): {problem}")


def environment_then_file(
    settings_cls: type[BaseSettings],
    init_settings: PydanticBaseSettingsSource,
    env_settings: PydanticBaseSettingsSource,
) -> tuple[PydanticBaseSettingsSource, ...]:
    """The sources for ``settings_customise_sources``: arguments, then the environment, then the
    TOML file named by ``<PREFIX>CONFIG`` when it is set."""
    config_file = os.environ.get(Naming.of(settings_cls).config_variable)
    if not config_file:
        return (init_settings, env_settings)
    return (init_settings, env_settings, TomlConfigSettingsSource(settings_cls, Path(config_file)))


class FileSettings(BaseSettings):
    """Settings read by this loader: the environment over the TOML file its ``<PREFIX>CONFIG``
    variable names (loopd's and brokerd's both)."""

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        return environment_then_file(settings_cls, init_settings, env_settings)


def nested_model(annotation: Any) -> type[BaseModel] | None:
    """The model a field holds as one table (``ChatSettings``, ``BrokerSettings | None``), if
    any; a list of tables (``tuple[McpServerConfig, ...]``) is one setting, not a table."""
    is_union = typing.get_origin(annotation) in (typing.Union, types.UnionType)
    for candidate in typing.get_args(annotation) if is_union else (annotation,):
        if isinstance(candidate, type) and issubclass(candidate, BaseModel):
            return candidate
    return None


def setting_paths(model: type[BaseModel]) -> list[tuple[str, ...]]:
    """Every setting of ``model`` as a path: ``("model",)``, ``("mm", "url")``."""
    paths: list[tuple[str, ...]] = []
    for name, field in model.model_fields.items():
        table = nested_model(field.annotation)
        if table is None:
            paths.append((name,))
        else:
            paths.extend((name, key) for key in table.model_fields)
    return paths


def known_variables(model: type[BaseSettings]) -> frozenset[str]:
    """Every variable ``model`` reads: its settings' and the config file's."""
    naming = Naming.of(model)
    names = {naming.variable(path) for path in setting_paths(model)}
    return frozenset({naming.config_variable, *names})


def _suggestion(name: str, known: Iterable[str], quote: str = "") -> str:
    close = difflib.get_close_matches(name, sorted(known), n=1)
    return f"; did you mean {quote}{close[0]}{quote}?" if close else ""


def unknown_variables(environ: Mapping[str, str], model: type[BaseSettings]) -> str | None:
    """One line naming each variable with the model's prefix that names no setting, or None.
    Names are not case sensitive, as pydantic-settings reads them."""
    naming, known = Naming.of(model), known_variables(model)
    unknown = sorted(
        name.upper()
        for name in environ
        if name.upper().startswith(naming.prefix) and name.upper() not in known
    )
    problems = [f"unknown setting {name}{_suggestion(name, known)}" for name in unknown]
    return "; ".join(problems) or None


def _path_of(error: ErrorDetails) -> tuple[str, ...]:
    """The setting an error is about: its location up to the first list index."""
    path: list[str] = []
    for part in error["loc"]:
        if not isinstance(part, str):
            break
        path.append(part)
    return tuple(path)


def _file_key(error: ErrorDetails) -> str:
    """The error's place in the file: ``mm.url``, ``mcp[0].url`` for an array of tables."""
    key = ""
    for part in error["loc"]:
        key += f"[{part}]" if isinstance(part, int) else f".{part}" if key else str(part)
    return key


def _problem(error: ErrorDetails) -> str:
    if error["type"] == "value_error":  # our own validators: their words, without pydantic's
        return str(error.get("ctx", {}).get("error", error["msg"]))
    if error["type"] == "missing":
        return "required"
    return error["msg"]


def describe_validation_error(
    exc: ValidationError,
    model: type[BaseSettings],
    environ: Mapping[str, str],
    config_file: Path | None,
) -> str:
    """Every problem on one line, each led by where its value came from (never the value itself,
    which may be a secret)."""
    naming = Naming.of(model)
    set_here = {name.upper() for name in environ}
    problems = []
    for error in exc.errors(include_url=False, include_input=False):
        path = _path_of(error)
        if not path:  # a rule: its words name the settings
            problems.append(_problem(error))
            continue
        variable = naming.variable(path)
        from_file = config_file is not None and variable not in set_here
        where = f"`{_file_key(error)}` in {config_file}" if from_file else variable
        if error["type"] == "extra_forbidden" and from_file:
            in_a_table = len(path) == len(error["loc"])  # not in an array of tables: no guess
            siblings = _sibling_keys(model, path) if in_a_table else []
            hint = _suggestion(naming.key(path), siblings, quote="`")
            problems.append(f"unknown setting {where}{hint}")
        elif error["type"] == "extra_forbidden":
            hint = _suggestion(variable, known_variables(model))
            problems.append(f"unknown setting {variable}{hint}")
        else:
            problems.append(f"{where}: {_problem(error)}")
    return "; ".join(problems)


def _sibling_keys(model: type[BaseModel], path: Sequence[str]) -> list[str]:
    """The keys a file may have where ``path`` is: ``mm.url`` beside ``mm.urll``."""
    return [Naming.key(known) for known in setting_paths(model) if len(known) == len(path)]


def load(model: type[S], /, **overrides: Any) -> S:
    """``model`` from the environment and its config file (``overrides`` win over both; a
    setting may be called ``model``, hence the positional-only parameter); ``ConfigError`` with
    one line for anything wrong."""
    naming = Naming.of(model)
    if (problem := unknown_variables(os.environ, model)) is not None:
        raise ConfigError(problem)
    config_file = _config_file(naming)
    try:
        return model(**overrides)
    except ValidationError as exc:
        raise ConfigError(describe_validation_error(exc, model, os.environ, config_file)) from None
    except SettingsError as exc:  # a complex value (JSON) in a variable that does not parse
        raise ConfigError(" ".join(str(exc).split())) from None
    except OSError as exc:
        raise ConfigError(f"{naming.config_variable}: cannot read {config_file}: {exc}") from None
    except ValueError as exc:  # a TOML syntax error
        raise ConfigError(f"{naming.config_variable}: {config_file}: {exc}") from None


def _config_file(naming: Naming) -> Path | None:
    name = os.environ.get(naming.config_variable)
    if not name:
        return None
    path = Path(name)
    if path.is_dir():
        raise ConfigError(f"{naming.config_variable}: {_folder_named(path)}")
    if not path.is_file():
        raise ConfigError(f"{naming.config_variable}: no such file: {path}")
    return path


def _folder_named(path: Path) -> str:
    """What to say of a config variable that names a folder: the TOML files in it, if any."""
    try:
        found = sorted(p.name for p in path.glob("*.toml"))[:5]
    except OSError:
        found = []
    held = f" (it holds {', '.join(found)})" if found else ""
    return f"{path} is a folder, not a file: name the TOML file itself{held}"


class _Named(Protocol):
    @property
    def name(self) -> str: ...


_NamedT = TypeVar("_NamedT", bound=_Named)


def unique_endpoint_names(endpoints: tuple[_NamedT, ...]) -> tuple[_NamedT, ...]:
    """A validator for ``[[endpoint]]`` tables (loopd's and brokerd's): each name once, as the
    name is what the log, the sockets and the expectations are keyed by."""
    seen: set[str] = set()
    for endpoint in endpoints:
        if endpoint.name in seen:
            raise ValueError(f"two [[endpoint]] tables are named {endpoint.name!r}")
        seen.add(endpoint.name)
    return endpoints
