"""brokerd's host configuration: environment variables ``BROKERD_*`` over an optional TOML file.

The file is named by ``BROKERD_CONFIG``; nested settings use ``__`` in variable names (e.g.
``BROKERD_BROKER__AUDIT_DB``) or a ``[broker]`` table in the file. Secrets never sit in the
settings themselves: the settings name files, read once at startup by ``read_secrets``.

The inference proxy serves one llama-server (``inference_url`` and its ``inference_*`` rules, on
``infer.sock``) or several: one ``[[endpoint]]`` table each, served on ``infer-NAME.sock``, each
with its own URL, key file, slots and models. The two forms do not mix (rule
``one_inference_form``).

The settings are loaded by ``loopcommon.configload``, as loopd's are: the same sources, the same
refusal of an unknown ``BROKERD_*`` variable (with the likely name), the same one-line
``ConfigError``.
"""

import difflib
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Final, Literal, Self

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, field_validator, model_validator
from pydantic_settings import SettingsConfigDict

from brokerd.approval import unknown_names
from brokerd.mcp.config import McpServerConfigs
from brokerd.proxy.chatpolicy import valid_entry
from brokerd.proxy.upstream import parse_upstream
from brokerd.tools.settings import BrokerSettings
from loopcommon import configload
from loopcommon.address import check_address
from loopcommon.errors import ConfigError

ENV_PREFIX: Final = "BROKERD_"
NESTED_DELIMITER: Final = "__"
CONFIG_FILE_VARIABLE: Final = f"{ENV_PREFIX}CONFIG"
DEFAULT_SOCKET_DIR: Final = Path("/run/brokerd")
# An endpoint's name is part of its socket's file name (infer-NAME.sock) and of loopd's config.
ENDPOINT_NAME_PATTERN: Final = r"^[a-z0-9][a-z0-9_-]{0,31}$"
SlotId = Annotated[int, Field(ge=0)]
DEFAULT_SLOT_SAVE_MAX_BYTES: Final = 20 * 1024**3
SLOT_SAVE_DIRS_HELP: Final = (
    "The server's --slot-save-path folder(s) as this host sees them (a router whose models "
    "save apart: each); brokerd keeps the saves it forwarded there under slot_save_max_bytes "
    "(other clients' files are left alone). Empty: brokerd bounds nothing."
)
SLOT_SAVE_MAX_HELP: Final = (
    "Bytes the saves brokerd forwarded may take in slot_save_dirs, all together; after each "
    "save the least recently used go first."
)


def _checked_upstream(value: str) -> str:
    parse_upstream(value)  # its ValueError names what is wrong; pydantic adds the field
    return value


class InferenceEndpoint(BaseModel):
    """One llama-server the box may reach, on its own socket ``infer-NAME.sock``; the slot and
    model rules are this server's alone."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str = Field(
        pattern=ENDPOINT_NAME_PATTERN, description="Names the socket: infer-NAME.sock."
    )
    url: Annotated[str, AfterValidator(_checked_upstream)] = Field(
        description="llama-server: http://host:port, https://..., or unix:/path/to.sock."
    )
    key_file: Path | None = Field(
        default=None, description="File holding this server's API key, if it has one."
    )
    inference_slots: tuple[SlotId, ...] = Field(
        default=(), description="Slot ids the box may name on this server (empty: any, and -1)."
    )
    inference_models: tuple[str, ...] = Field(
        default=(), description="Model ids the box may name on this server (empty: any)."
    )
    slot_save_dirs: tuple[Path, ...] = Field(default=(), description=SLOT_SAVE_DIRS_HELP)
    slot_save_max_bytes: int = Field(
        default=DEFAULT_SLOT_SAVE_MAX_BYTES, gt=0, description=SLOT_SAVE_MAX_HELP
    )

    @property
    def socket_name(self) -> str:
        return f"infer-{self.name}.sock"


InferenceEndpoints = Annotated[
    tuple[InferenceEndpoint, ...], AfterValidator(configload.unique_endpoint_names)
]
# The settings of the single-endpoint form; none of them may be set beside [[endpoint]] tables.
SINGLE_ENDPOINT_SETTINGS: Final = (
    "inference_url",
    "inference_slots",
    "inference_models",
    "inference_key_file",
    "slot_save_dirs",
    "slot_save_max_bytes",
)


class BrokerdSettings(configload.FileSettings):
    model_config = SettingsConfigDict(
        env_prefix=ENV_PREFIX,
        env_nested_delimiter=NESTED_DELIMITER,
        extra="forbid",
        frozen=True,
    )

    socket_dir: Path = Field(
        default=DEFAULT_SOCKET_DIR, description="Folder for infer.sock, chat.sock, broker.sock."
    )
    inference_url: str = Field(
        default="http://127.0.0.1:8080",
        description="llama-server: http://host:port, https://..., or unix:/path/to.sock.",
    )
    inference_slots: tuple[SlotId, ...] = Field(
        default=(),
        description=(
            "Slot ids the box may name as id_slot (empty: any, and -1). When set, a request "
            "naming another slot, -1 or none gets 403."
        ),
    )
    inference_models: tuple[str, ...] = Field(
        default=(), description="Model ids the box may name (empty: any)."
    )
    inference_key_file: Path | None = Field(
        default=None, description="File holding llama-server's API key, if it has one."
    )
    slot_save_dirs: tuple[Path, ...] = Field(default=(), description=SLOT_SAVE_DIRS_HELP)
    slot_save_max_bytes: int = Field(
        default=DEFAULT_SLOT_SAVE_MAX_BYTES, gt=0, description=SLOT_SAVE_MAX_HELP
    )
    endpoint: InferenceEndpoints = Field(
        default=(),
        description="Several llama-servers, one [[endpoint]] table each (name, url, key_file, "
        "inference_slots, inference_models, slot_save_dirs, slot_save_max_bytes), each served "
        "on infer-NAME.sock; instead of inference_url and its settings.",
    )
    mattermost_url: str | None = Field(
        default=None, description="Mattermost base URL (needed to serve chat.sock)."
    )
    mattermost_token_file: Path | None = Field(
        default=None, description="File holding the bot's access token (needed for chat.sock)."
    )
    chat_allowed_teams: tuple[str, ...] = Field(
        default=(),
        description="Team ids in whose channels the box may post (`*`: every team).",
    )
    chat_allowed_channels: tuple[str, ...] = Field(
        default=(),
        description="Channel ids the box may post in, besides the allowed teams' (`*`: all).",
    )
    chat_allowed_users: tuple[str, ...] = Field(
        default=(),
        description=(
            "User ids whose direct and group messages with the bot the box may post in "
            "(`*`: everyone)."
        ),
    )
    body_cap_bytes: int = Field(
        default=64 * 1024 * 1024,
        gt=0,
        description="Largest request body the inference proxy accepts (a whole conversation).",
    )
    chat_body_cap_bytes: int = Field(
        default=1024 * 1024, gt=0, description="Largest request body the chat proxy accepts."
    )
    max_connections_per_socket: int = Field(
        default=100,
        ge=1,
        le=10000,
        description="Connections each socket holds open at once; more wait in the backlog.",
    )
    header_timeout_s: float = Field(
        default=10.0, gt=0, description="Time a connection has to send each request head."
    )
    body_timeout_s: float = Field(
        default=60.0, gt=0, description="Time a request has to send its whole body."
    )
    body_memory_bytes: int = Field(
        default=128 * 1024 * 1024,
        gt=0,
        description="Request-body bytes held in memory at once, all sockets together.",
    )
    broker: BrokerSettings | None = Field(
        default=None, description="Tool broker settings (needed to serve broker.sock)."
    )
    log_level: Literal["debug", "info", "warning", "error"] = "info"
    metrics_addr: Annotated[str | None, AfterValidator(check_address)] = Field(
        default=None,
        description="Where brokerd serves /metrics (and loopd's pages under /loopd/): "
        "unix:/path (outside socket_dir) or 127.0.0.1:PORT. Unset: off.",
    )
    metrics_relay: Path | None = Field(
        default=None,
        description="loopd's metrics socket as the host sees it (in the folder loopd.container "
        "mounts at /run/loopd-metrics), relayed at metrics_addr under /loopd/.",
    )
    mcp: McpServerConfigs = Field(
        default=(), description="MCP servers whose tools the broker offers."
    )

    @field_validator("chat_allowed_teams", "chat_allowed_channels", "chat_allowed_users")
    @classmethod
    def _mattermost_ids(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        for entry in value:
            if not valid_entry(entry):
                raise ValueError(
                    f"{entry!r} is not a Mattermost id (26 lower-case letters and digits) or *"
                )
        return value

    @field_validator("inference_url", "mattermost_url")
    @classmethod
    def _upstream_url(cls, value: str | None) -> str | None:
        return _checked_upstream(value) if value is not None else None

    @model_validator(mode="after")
    def _one_inference_form(self) -> Self:
        mixed = [name for name in SINGLE_ENDPOINT_SETTINGS if name in self.model_fields_set]
        if self.endpoint and mixed:
            raise ValueError(
                f"contradictory settings (one_inference_form): {', '.join(mixed)} with "
                "[[endpoint]] tables; give each server's settings in its own table"
            )
        return self

    def inference_endpoints(self) -> tuple[InferenceEndpoint | None, ...]:
        """The servers the inference proxy serves: the ``[[endpoint]]`` tables, or None for the
        single server of ``inference_url`` (served on ``infer.sock``)."""
        return self.endpoint or (None,)


def setting_name(*path: str) -> str:
    """The variable that sets a setting (``BROKERD_MATTERMOST_URL``), for messages about it."""
    return configload.Naming.of(BrokerdSettings).variable(path)


def check_approval_names(
    approval: Collection[str], catalogue: Collection[str], servers: Collection[str]
) -> None:
    """``ConfigError`` naming each tool of ``[broker.approval]`` that no tool can be, with the
    name it most likely meant: misspelt, it would leave its tool at its default without a word
    (``brokerd serve`` and ``brokerd tools list`` both refuse it)."""
    unknown = unknown_names(approval, catalogue, servers)
    if unknown:
        problems = [_no_such_tool(name, catalogue, servers) for name in unknown]
        raise ConfigError(f"{setting_name('broker', 'approval')}: {'; '.join(problems)}")


def _no_such_tool(name: str, catalogue: Collection[str], servers: Collection[str]) -> str:
    server, dot, tool = name.partition(".")
    if dot and not servers:
        where = "no [[mcp]] server is configured"
    elif dot:
        where = f"no [[mcp]] server is named `{server}`"
    else:
        where = "the catalogue has no such tool"
    likely = [*catalogue, *(f"{other}.{tool}" for other in servers if dot)]
    close = difflib.get_close_matches(name, sorted(likely), n=1)
    return f"`{name}`: {where}" + (f" (did you mean `{close[0]}`?)" if close else "")


def load_settings() -> BrokerdSettings:
    """Settings from the environment and the ``BROKERD_CONFIG`` file; ``ConfigError`` if bad.
    A misspelt ``BROKERD_*`` variable is refused: ignored, its setting would keep the default
    (an upstream on port 8080)."""
    return configload.load(BrokerdSettings)


@dataclass(frozen=True)
class Secrets:
    """What the secret files held; kept out of the settings so they never print with them."""

    inference_key: str | None
    bot_token: str | None
    # Each [[endpoint]]'s key, by the endpoint's name (only those with a key file).
    endpoint_keys: Mapping[str, str] = field(default_factory=dict)

    def values(self) -> list[str]:
        keys = [self.inference_key, self.bot_token, *self.endpoint_keys.values()]
        return [secret for secret in keys if secret]


def read_secret(path: Path, setting: str) -> str:
    """A secret file's content, trimmed; ``ConfigError`` naming ``setting`` if unreadable or
    empty."""
    try:
        value = path.read_text(encoding="utf-8").strip()
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{setting}: cannot read {path}: {exc}") from None
    if not value:
        raise ConfigError(f"{setting}: {path} is empty")
    if any(char.isspace() for char in value):
        raise ConfigError(f"{setting}: {path} holds more than one token (whitespace inside)")
    return value


def read_secrets(settings: BrokerdSettings) -> Secrets:
    key_file, token_file = settings.inference_key_file, settings.mattermost_token_file
    return Secrets(
        inference_key=_secret(key_file, "inference_key_file"),
        bot_token=_secret(token_file, "mattermost_token_file"),
        endpoint_keys={
            endpoint.name: read_secret(
                endpoint.key_file, f"{setting_name('endpoint')} {endpoint.name}: key_file"
            )
            for endpoint in settings.endpoint
            if endpoint.key_file is not None
        },
    )


def _secret(path: Path | None, field: str) -> str | None:
    return read_secret(path, setting_name(field)) if path is not None else None
