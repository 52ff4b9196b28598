"""loopd's configuration: one pydantic-settings model.

Sources, highest priority first: ``LOOPD_*`` environment variables, then the TOML file named by
``LOOPD_CONFIG`` (optional), then the defaults below. Every knob is listed in the README's table;
``loopd config --table`` prints that table from this model so the two cannot drift.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Annotated, Any

from pydantic import Field, ValidationError, field_validator
from pydantic_settings import (
    BaseSettings,
    NoDecode,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    SettingsError,
    TomlConfigSettingsSource,
)

from loopd.errors import ConfigError

# The core tools array ships inside the package, so an installed wheel finds it wherever it lives.
CORE_TOOLS_FILE = Path(__file__).resolve().parent / "data" / "tools.schema.json"


def _default_cache_dir() -> Path:
    return Path.home() / ".cache" / "loopd"


def _default_state_dir() -> Path:
    return Path.home() / ".local" / "state" / "loopd"


class Settings(BaseSettings):
    """Everything loopd can be told. Field descriptions become the README table."""

    model_config = SettingsConfigDict(env_prefix="LOOPD_", extra="forbid", frozen=True)

    infer_url: str = Field(
        "http://127.0.0.1:8080",
        description="llama-server (or brokerd's inference proxy): `http://host:port` or "
        "`unix:/path/to.sock`.",
    )
    model: str = Field(
        "smollm2",
        description="Model id sent in every request (router mode selects the child by it).",
    )
    state_dir: Path = Field(
        default_factory=_default_state_dir,
        description="Where loopd keeps its session log (`loopd.db`). Default "
        "`~/.local/state/loopd`.",
    )
    cache_dir: Path = Field(
        default_factory=_default_cache_dir,
        description="Build cache for the real llama-server and the test model. Default "
        "`~/.cache/loopd`.",
    )
    workspace_dir: Path | None = Field(
        None,
        description="Root of the session workspaces (one folder per session). Default "
        "`<state_dir>/workspaces`.",
    )
    unsandboxed_commands: bool = Field(
        False,
        description="Let run_command run commands without a sandbox where bubblewrap cannot "
        "work (they then read all loopd can and reach brokerd's sockets). Off: they are refused.",
    )
    tools_file: Path = Field(
        default_factory=lambda: CORE_TOOLS_FILE,
        description="The core tools array sent in every request of an epoch. Default: "
        "`loopd/data/tools.schema.json`, shipped in the package.",
    )
    broker_url: str = Field(
        "unix:/run/loopd/broker.sock",
        description="brokerd's tool broker: `unix:/path` or `http://host:port`.",
    )
    # NoDecode: the environment gives "0,1", not JSON; the validator below parses it.
    slots: Annotated[tuple[int, ...], NoDecode] = Field(
        (0,),
        description="The harness's slots on the server, a comma list (e.g. `0,1`). A session "
        "keeps one slot for life.",
    )
    first_byte_s: float = Field(
        900.0,
        gt=0,
        description="Longest wait for a request's first byte (it may be queued behind another "
        "client; `/slots` is polled meanwhile).",
    )
    silence_s: float = Field(
        60.0, gt=0, description="Longest silence once a stream has begun; then it is closed."
    )
    connect_s: float = Field(
        5.0, gt=0, description="Timeout for connecting and for small calls (`/health`, `/slots`)."
    )
    think_cap: int = Field(
        8192,
        ge=0,
        description="Thinking tokens allowed per request before loopd ends the reasoning with "
        "the control call.",
    )
    max_tokens: int = Field(
        4096, ge=1, description="Ceiling on generated tokens per request (`max_tokens`)."
    )
    temperature: float = Field(0.6, ge=0, description="Sampling temperature sent in every request.")
    top_p: float = Field(0.95, ge=0, le=1, description="Sampling top_p sent in every request.")
    top_k: int = Field(20, ge=0, description="Sampling top_k sent in every request.")
    min_p: float = Field(0.0, ge=0, le=1, description="Sampling min_p sent in every request.")
    compact_at: float = Field(
        0.75,
        gt=0,
        lt=1,
        description="Share of a slot's context past which the next turn first compacts the "
        "conversation into a new epoch.",
    )
    summary_max_tokens: int = Field(
        512, ge=32, description="`max_tokens` of the compaction request (summary)."
    )
    prewarm: bool = Field(
        False,
        description="Read a session's prompt back into its idle slot (`max_tokens: 1`) so its "
        "next turn processes only its own tokens: after a compaction, once another session has "
        "used the slot, and after a restart, for each slot's most recent session.",
    )
    system_text: str = Field(
        "You are loopd, a helpful assistant working in a team's chat thread. Answer briefly.",
        description="The system text of a new epoch.",
    )
    log_format: str = Field(
        "auto",
        description="`auto` (human on a terminal, JSON lines otherwise), `human` or `json`.",
    )
    log_level: str = Field("INFO", description="Python logging level name.")

    @field_validator("slots", mode="before")
    @classmethod
    def _parse_slots(cls, value: Any) -> Any:
        if isinstance(value, str):
            parts = [p.strip() for p in value.split(",") if p.strip()]
            if not parts:
                raise ValueError("needs at least one slot id")
            return tuple(int(p) for p in parts)
        if isinstance(value, int):
            return (value,)
        return value

    @field_validator("slots")
    @classmethod
    def _check_slots(cls, value: tuple[int, ...]) -> tuple[int, ...]:
        if not value or any(s < 0 for s in value) or len(set(value)) != len(value):
            raise ValueError("slot ids must be distinct non-negative integers")
        return value

    @field_validator("infer_url", "broker_url")
    @classmethod
    def _check_url(cls, value: str) -> str:
        if value.startswith("unix:"):
            if not value[len("unix:") :]:
                raise ValueError("unix: URL needs a socket path, e.g. unix:/run/loopd/infer.sock")
            return value
        if value.startswith(("http://", "https://")):
            return value.rstrip("/")
        raise ValueError("must start with http://, https:// or unix:")

    @field_validator("log_level")
    @classmethod
    def _check_log_level(cls, value: str) -> str:
        name = value.strip().upper()
        if name not in logging.getLevelNamesMapping():
            raise ValueError("must be a logging level: DEBUG, INFO, WARNING, ERROR or CRITICAL")
        return name

    @field_validator("log_format")
    @classmethod
    def _check_log_format(cls, value: str) -> str:
        if value not in ("auto", "human", "json"):
            raise ValueError("must be auto, human or json")
        return value

    @property
    def db_path(self) -> Path:
        return self.state_dir / "loopd.db"

    @property
    def workspaces(self) -> Path:
        return self.workspace_dir or self.state_dir / "workspaces"

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        sources: list[PydanticBaseSettingsSource] = [init_settings, env_settings]
        toml_path = os.environ.get("LOOPD_CONFIG")
        if toml_path:
            sources.append(TomlConfigSettingsSource(settings_cls, toml_file=Path(toml_path)))
        return tuple(sources)


def load_settings(**overrides: Any) -> Settings:
    """Build the settings, turning every validation failure into one readable ConfigError."""
    toml_path = os.environ.get("LOOPD_CONFIG")
    if toml_path and not Path(toml_path).is_file():
        raise ConfigError(f"LOOPD_CONFIG={toml_path}: no such file")
    try:
        return Settings(**overrides)
    except ValidationError as exc:
        first = exc.errors()[0]
        field = ".".join(str(p) for p in first["loc"]) or "config"
        where = f"LOOPD_{field.upper()}"
        if toml_path:
            where = f"{where} (or `{field}` in {toml_path})"
        raise ConfigError(f"invalid configuration: {where}: {first['msg']}") from exc
    except SettingsError as exc:
        raise ConfigError(f"invalid configuration: {exc}") from exc
    except (OSError, ValueError) as exc:  # a TOML file that does not parse
        raise ConfigError(f"invalid configuration file {toml_path}: {exc}") from exc


def settings_table(model: type[BaseSettings] = Settings) -> str:
    """The README's table of every knob of ``model``, generated so the two cannot drift."""
    prefix = str(model.model_config.get("env_prefix", ""))
    rows = ["| Variable | Default | Meaning |", "|---|---|---|"]
    for name, field in model.model_fields.items():
        if field.default_factory is not None:
            default = "(see meaning)"
        else:
            default = f"`{_render_default(field.default)}`"
        rows.append(f"| `{prefix}{name.upper()}` | {default} | {field.description or ''} |")
    return "\n".join(rows)


def _render_default(value: Any) -> str:
    if isinstance(value, tuple):
        return ",".join(str(v) for v in value)
    return str(value)
