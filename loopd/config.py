"""loopd's configuration: one pydantic-settings model, ``Settings``.

Sources, highest priority first: ``LOOPD_*`` environment variables, then the TOML file named by
``LOOPD_CONFIG`` (optional), then the defaults below; ``load_settings`` reads them through
``loopcommon.configload``, the loader brokerd shares. The Mattermost adapter's settings are the
``mm`` table (``LOOPD_MM_URL`` or ``url`` under ``[mm]`` in the file), a ``ChatSettings``. Every
knob is listed in the README's tables; ``loopd config --table`` prints them from this model so the
two cannot drift.

The servers loopd places sessions on are ``endpoints()``: the file's ``[[endpoint]]`` tables
(``name``, ``url``, ``model``, ``slots``), or else the one server that ``infer_url``, ``model``
and ``slots`` describe (the shorthand); the two forms do not mix (rule ``one_endpoint_form``).

The engine's own records of these numbers (``Limits``, ``BudgetRules``, ``Sampling``) hold their
defaults, and the settings take theirs from them, so each default is written once, there; the
settings sit above the engine and the context window, which never read them (the layers:
docs/design.md).
"""

from __future__ import annotations

import json
import logging
import os
import sys
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any, Final, Self

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    field_validator,
    model_validator,
)
from pydantic_settings import (
    BaseSettings,
    NoDecode,
    SettingsConfigDict,
)

from loopcommon import configload
from loopcommon.address import check_address
from loopcommon.approvals import ApprovalMode
from loopcommon.configload import Rule
from loopcommon.errors import ConfigError
from loopd.chatsettings import ChatSettings
from loopd.contextwindow.budget import BudgetRules
from loopd.datafiles import CORE_TOOLS_FILE as CORE_TOOLS_FILE  # LOOPD_TOOLS_FILE's default
from loopd.engine.durable import DurableMode
from loopd.engine.guards import GuardLimits
from loopd.engine.limits import Limits
from loopd.engine.pinning import PinSlots
from loopd.engine.request import Sampling

# The defaults of the settings that the engine and the context window read are theirs, written
# once there: a request's limits and sampling, the loop guards' limits, and the context budget's
# sizes.
_LIMITS: Final = Limits()
_SAMPLING: Final = Sampling()
_GUARDS: Final = GuardLimits()
_BUDGET: Final = BudgetRules()


def _default_state_dir() -> Path:
    return Path.home() / ".local" / "state" / "loopd"


def check_server_url(value: str) -> str:
    """A server URL as loopd takes it: ``unix:/path``, or ``http(s)://...`` without a trailing
    slash."""
    if value.startswith("unix:"):
        if not value[len("unix:") :]:
            raise ValueError("unix: URL needs a socket path, e.g. unix:/run/loopd/infer.sock")
        return value
    if value.startswith(("http://", "https://")):
        return value.rstrip("/")
    raise ValueError("must start with http://, https:// or unix:")


def parse_slot_list(value: Any) -> Any:
    """``"0,1"`` (the environment's form) or a lone id as a tuple; a list passes as it is."""
    if isinstance(value, str):
        parts = [p.strip() for p in value.split(",") if p.strip()]
        if not parts:
            raise ValueError("needs at least one slot id")
        if not all(p.isdigit() for p in parts):
            raise ValueError("must be a comma list of slot ids, e.g. 0,1")
        return tuple(int(p) for p in parts)
    if isinstance(value, int):
        return (value,)
    return value


def check_slot_list(value: tuple[int, ...]) -> tuple[int, ...]:
    if not value or any(s < 0 for s in value) or len(set(value)) != len(value):
        raise ValueError("slot ids must be distinct non-negative integers")
    return value


# NoDecode: the environment gives "0,1", not JSON; the validators parse it.
SlotList = Annotated[
    tuple[int, ...], NoDecode, BeforeValidator(parse_slot_list), AfterValidator(check_slot_list)
]
ServerURL = Annotated[str, AfterValidator(check_server_url)]
# A name is part of file names (the endpoint's recorded expectations) and of log lines.
ENDPOINT_NAME_PATTERN: Final = r"^[a-z0-9][a-z0-9_-]{0,31}$"
# The name of the one server the shorthand settings (infer_url, model, slots) describe.
SHORTHAND_ENDPOINT: Final = "default"


def _core_tool_mode(tool: str) -> Any:
    """The setting of one core tool in ``[approval]``."""
    return Field(
        default="auto", description=f"`ask`: each call of {tool} waits for a person; `auto`: not."
    )


class ApprovalSettings(BaseModel):
    """``[approval]``: how long a person has to decide on a call that asks, and which of loopd's
    core tools ask (brokerd's tools ask by brokerd's ``[broker.approval]``). A core tool works
    inside the session's workspace only, so each runs at once unless set to ``ask``."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    timeout_s: float = Field(
        default=600.0,
        gt=0,
        le=7 * 24 * 3600,
        description="How long a tool call that waits for a person's approval waits for their "
        "decision (a reaction in the thread, y/n in the terminal) before it is denied.",
    )
    read_file: ApprovalMode = _core_tool_mode("read_file")
    list_dir: ApprovalMode = _core_tool_mode("list_dir")
    search_files: ApprovalMode = _core_tool_mode("search_files")
    write_file: ApprovalMode = _core_tool_mode("write_file")
    edit_file: ApprovalMode = _core_tool_mode("edit_file")
    run_command: ApprovalMode = _core_tool_mode("run_command")

    def asks(self, tool: str) -> bool:
        """Whether a call of the core tool ``tool`` waits for a person."""
        return tool in type(self).model_fields and getattr(self, tool) == "ask"


class EndpointSettings(BaseModel):
    """One llama-server loopd places sessions on: a ``[[endpoint]]`` table of the file."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(pattern=ENDPOINT_NAME_PATTERN, description="How loopd names the server.")
    url: ServerURL = Field(
        description="The server (or brokerd's `infer-NAME.sock`): `http://host:port` or "
        "`unix:/path`."
    )
    model: str = Field(description="Model id sent in every request to this server.")
    slots: SlotList = Field(default=(0,), description="The harness's slots on this server.")


def _parse_endpoint_tables(value: Any) -> Any:
    """The environment's ``LOOPD_ENDPOINT``: JSON, as the tables would be written, or empty for
    none (what a dump of the default gives); the file's tables pass as they are."""
    if isinstance(value, str):
        return json.loads(value) if value.strip() else ()
    return value


# NoDecode: an empty LOOPD_ENDPOINT is no tables, not a JSON error.
EndpointTables = Annotated[
    tuple[EndpointSettings, ...],
    NoDecode,
    BeforeValidator(_parse_endpoint_tables),
    AfterValidator(configload.unique_endpoint_names),
]
# The shorthand's settings; none of them may be set beside [[endpoint]] tables.
SHORTHAND_SETTINGS: Final = ("infer_url", "model", "slots")
NO_MODEL: Final = (
    "no model named: set LOOPD_MODEL (`model` in the config file) to the model id the server "
    "serves, or give [[endpoint]] tables"
)


class Settings(configload.FileSettings):
    """Everything loopd can be told. Field descriptions become the README tables."""

    # LOOPD_MM_URL is mm.url: a table's key follows "MM_" unsplit (mm.allowed_users stays whole).
    model_config = SettingsConfigDict(
        env_prefix="LOOPD_",
        env_nested_delimiter="_",
        env_nested_max_split=1,
        extra="forbid",
        frozen=True,
    )

    infer_url: str = Field(
        default="http://127.0.0.1:8080",
        description="llama-server (or brokerd's inference proxy): `http://host:port` or "
        "`unix:/path/to.sock`.",
    )
    model: str = Field(
        default="",
        description="Model id sent in every request (router mode selects the child by it). No "
        "default: name the model the server serves, or give `[[endpoint]]` tables.",
    )
    state_dir: Path = Field(
        default_factory=_default_state_dir,
        description="Where loopd keeps its session log (`loopd.db`). Default "
        "`~/.local/state/loopd`.",
    )
    workspace_dir: Path | None = Field(
        default=None,
        description="Root of the session workspaces (one folder per session). Default "
        "`<state_dir>/workspaces`.",
    )
    workspace_max_bytes: int = Field(
        default=1024**3,
        ge=0,
        description="The most one session's workspace may hold, in bytes (0: no quota). A "
        "command is stopped once it grows the workspace past it, and writes are refused until "
        "files are deleted; each says so in one line.",
    )
    disk_reserve_bytes: int = Field(
        default=64 * 1024**2,
        ge=0,
        description="Free bytes the workspaces' filesystem keeps for the session log: a command "
        "is stopped, and a write refused, that would leave less.",
    )
    unsandboxed_commands: bool = Field(
        default=False,
        description="Let run_command run commands without a sandbox where bubblewrap cannot "
        "work (they then read all loopd can and reach brokerd's sockets). Off: they are refused.",
    )
    tools_file: Path = Field(
        default_factory=lambda: CORE_TOOLS_FILE,
        description="The core tools array sent in every request of an epoch. Default: "
        "`loopd/data/tools.schema.json`, shipped in the package.",
    )
    broker_url: str = Field(
        default="unix:/run/loopd/broker.sock",
        description="brokerd's tool broker: `unix:/path` or `http://host:port`.",
    )
    slots: SlotList = Field(
        default=(0,),
        description="The harness's slots on the server, a comma list (e.g. `0,1`). A session "
        "keeps one for life, as its slot where sessions are pinned, else as its lane: one turn "
        "per lane runs at once.",
    )
    pin_slots: PinSlots = Field(
        default=PinSlots.AUTO,
        description="Send each session's requests to its slot (`yes`), or let the server place "
        "each one (`no`: `id_slot` -1, restored from its host prompt cache). `auto` pins only "
        "where idle slots keep their prompt: the self-test's slot pool check (`loopd serve`), "
        "else the one recorded in the model's expectations, else not pinned. On a unified pool "
        "with `--cache-idle-slots` (the server's default) a pinned session kept 0 % of its "
        "cache once another slot ran, an unpinned one 97 to 100 % (docs/production-shape.md). "
        "Unpinned, `LOOPD_SLOTS` are lanes: how many turns run at once.",
    )
    pool_requests: int = Field(
        default=2,
        ge=1,
        description="Long requests to expect at once on a shared KV pool (a unified pool, "
        "known where the self-test found idle slots cleared): a session compacts at "
        "`compact_at` of the pool divided by this, so that it fits beside another long request "
        "(two on production: loopd and one other client). 1: the whole pool.",
    )
    selftest_every_s: float = Field(
        default=300.0,
        gt=0,
        description="While the server differs from the recorded expectations, `loopd serve` "
        "runs the self-test again this often, and serves again once it passes; while it "
        "matches, it checks the build, model, weights, template and slots this often, and "
        "reads whether the model sleeps, asking only what a sleeping model answers asleep "
        "(`/health`, `/models`, `/props` with `autoload=false`: it never wakes or loads it).",
    )
    endpoint: EndpointTables = Field(
        default=(),
        description="Several servers, one `[[endpoint]]` table each in the file (`name`, `url`, "
        "`model`, `slots`), instead of `LOOPD_INFER_URL`, `LOOPD_MODEL` and `LOOPD_SLOTS` (the "
        "one-server shorthand). A session stays on its server while that server is up.",
    )
    first_byte_s: float = Field(
        default=_LIMITS.first_byte_s,
        gt=0,
        description="Longest wait for a request's first byte (it may be queued behind another "
        "client; `/slots` is polled meanwhile).",
    )
    silence_s: float = Field(
        default=_LIMITS.silence_s,
        gt=0,
        description="Longest silence once a stream has begun; then it is closed.",
    )
    connect_s: float = Field(
        default=5.0,
        gt=0,
        description="Timeout for connecting and for small calls (`/health`, `/slots`).",
    )
    think_cap: int = Field(
        default=_LIMITS.think_cap,
        ge=0,
        description="Thinking tokens allowed per request before loopd ends the reasoning with "
        "the control call; `0` sets no cap (a model that does not think, or a `max_tokens` too "
        "small to leave an answer room). 6144 is below the production server's own "
        "`reasoning-budget` of 8192 (docs/production-shape.md), so loopd's cap fires first and "
        "its end of the reasoning is the one recorded; it must leave 1024 tokens below "
        "`max_tokens`.",
    )
    loop_window: int = Field(
        default=_LIMITS.loop_window,
        ge=0,
        description="Tokens (words and marks) of the model's thinking, and of its answer, that "
        "loopd watches for repetition as they stream: once they hold mostly the same few "
        "phrases again and again, a thought is ended with the control call (before "
        "`think_cap`) and an answer is closed and kept as written, each with one line saying "
        "so. `0`: off.",
    )
    max_tokens: int = Field(
        default=_BUDGET.max_tokens,
        ge=1,
        description="Ceiling on generated tokens per request (`max_tokens`). 12288 leaves 6144 "
        "tokens after a capped reasoning for the answer or a long tool call (a whole file for "
        "`write_file`).",
    )
    temperature: float = Field(
        default=_SAMPLING.temperature,
        ge=0,
        description="Sampling temperature sent in every request.",
    )
    top_p: float = Field(
        default=_SAMPLING.top_p, ge=0, le=1, description="Sampling top_p sent in every request."
    )
    top_k: int = Field(
        default=_SAMPLING.top_k, ge=0, description="Sampling top_k sent in every request."
    )
    min_p: float = Field(
        default=_SAMPLING.min_p, ge=0, le=1, description="Sampling min_p sent in every request."
    )
    repeat_limit: int = Field(
        default=_GUARDS.repeat,
        ge=0,
        description="Identical tool calls (same tool, same arguments once whitespace in strings "
        "and key order are folded) the model may repeat within a turn, with no write, edit or "
        "command between them: a repeat is not run but answered with a pointer to the earlier "
        "result, and the repeat that reaches this limit ends the turn with one line in the "
        "thread. `0`: off.",
    )
    cycle_limit: int = Field(
        default=_GUARDS.cycle,
        ge=0,
        description="Times the model may go round the same cycle of 2 to 4 different tool "
        "calls again (A, B, A, B is once) within a turn; the round that reaches it ends the "
        "turn with one line. `0`: off.",
    )
    failure_limit: int = Field(
        default=_GUARDS.failures,
        ge=0,
        description="Tool calls in a row that fail (a file that does not exist, a refused "
        "call, a command that exits non-zero) with no success between them; the last of them "
        "ends the turn with one line. `0`: off.",
    )
    calls_per_message: int = Field(
        default=_GUARDS.calls_per_message,
        ge=0,
        description="Tool calls one model message may make; the first call past it ends the "
        "turn with one line, and it and the rest of the message are not run. `0`: no limit.",
    )
    calls_per_turn: int = Field(
        default=_GUARDS.calls_per_turn,
        ge=0,
        description="Tool calls one turn may make; the first call past it ends the turn with "
        "one line, not run. `0`: no limit.",
    )
    tool_s_per_turn: float = Field(
        default=_GUARDS.tool_s_per_turn,
        ge=0,
        description="Seconds a turn's tool calls may run in all (a call waiting for a "
        "person's approval included); once reached, the turn ends with one line before its "
        "next call or request. `0`: no limit.",
    )
    compact_at: float = Field(
        default=_BUDGET.compact_at,
        gt=0,
        lt=1,
        description="Share of a slot's context (on a shared pool: of a session's share of it, "
        "`LOOPD_POOL_REQUESTS`) past which the next turn first compacts the conversation into a "
        "new epoch.",
    )
    summary_max_tokens: int = Field(
        default=_BUDGET.summary_max_tokens,
        ge=32,
        description="`max_tokens` of the compaction request (summary).",
    )
    prewarm: bool = Field(
        default=False,
        description="Read a session's prompt back into its idle slot (`max_tokens: 1`) so its "
        "next turn processes only its own tokens: after a compaction, once another session has "
        "used the slot, and after a restart, for each slot's most recent session. With "
        "`[[endpoint]]` tables: after a move, a session moved off a dead server is read on its "
        "new one while that is idle.",
    )
    durable: DurableMode = Field(
        default=DurableMode.AUTO,
        description="Durable sessions: save a session's slot state on the server's disk at the "
        "end of each turn (`--slot-save-path`), and restore it when the server no longer holds "
        "the session (a restart, a model reload, its idle sleep, an eviction), so a returning "
        "thread is not read again in full. `auto` turns them on where the self-test's probe "
        "saves and restores a slot (`loopd serve`'s at start; for `loopd chat` and `loopd run`, "
        "the answer `loopd selftest --record` stored), for each server; `on` without asking; "
        "`off` never.",
    )
    system_text: str = Field(
        default="You are loopd, a helpful assistant working in a team's chat thread. "
        "Answer briefly.",
        description="The system text of a new epoch.",
    )
    log_format: str = Field(
        default="auto",
        description="`auto` (human on a terminal, JSON lines otherwise), `human` or `json`.",
    )
    log_level: str = Field(default="INFO", description="Python logging level name.")
    metrics_addr: Annotated[str | None, AfterValidator(check_address)] = Field(
        default=None,
        description="Where `loopd serve` serves `/metrics` and the status page: "
        "`unix:/path/to.sock` (in the box: in /run/loopd-metrics, relayed by brokerd) or "
        "`127.0.0.1:PORT`. Unset: off.",
    )
    approval: ApprovalSettings = Field(
        default=ApprovalSettings(),
        description="Tool calls that wait for a person's approval (`LOOPD_APPROVAL_*`, or the "
        "file's `[approval]` table).",
    )
    mm: ChatSettings = Field(
        default=ChatSettings(),  # frozen, so one instance may be every default
        description="The Mattermost adapter's settings (`LOOPD_MM_*`, or the file's `[mm]` table).",
    )

    @field_validator("infer_url", "broker_url")
    @classmethod
    def _check_url(cls, value: str) -> str:
        return check_server_url(value)

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

    @model_validator(mode="after")
    def _follow_rules(self) -> Self:
        configload.check_rules(self, RULES)
        return self

    def endpoints(self) -> tuple[EndpointSettings, ...]:
        """The servers, in the order given: the ``[[endpoint]]`` tables, or the shorthand's one
        server (named ``default``)."""
        if self.endpoint:
            return self.endpoint
        if not self.model:
            raise ConfigError(NO_MODEL)
        shorthand = EndpointSettings(
            name=SHORTHAND_ENDPOINT, url=self.infer_url, model=self.model, slots=self.slots
        )
        return (shorthand,)

    @property
    def has_endpoint_tables(self) -> bool:
        """Whether the servers come from ``[[endpoint]]`` tables (not the shorthand)."""
        return bool(self.endpoint)

    def for_endpoint(self, endpoint: EndpointSettings) -> Settings:
        """These settings as the one-server form for ``endpoint``: what the code that talks to
        one server (the self-test, a turn) reads as ``infer_url``, ``model`` and ``slots``."""
        return self.model_copy(
            update={
                "infer_url": endpoint.url,
                "model": endpoint.model,
                "slots": endpoint.slots,
                "endpoint": (),
            }
        )

    @property
    def sampling(self) -> Sampling:
        """The sampling settings every request sends."""
        return Sampling(self.temperature, self.top_p, self.top_k, self.min_p)

    @property
    def guard_limits(self) -> GuardLimits:
        """The loop guards' settings (``loopd.engine.guards``)."""
        return GuardLimits(
            repeat=self.repeat_limit,
            cycle=self.cycle_limit,
            failures=self.failure_limit,
            calls_per_message=self.calls_per_message,
            calls_per_turn=self.calls_per_turn,
            tool_s_per_turn=self.tool_s_per_turn,
        )

    @property
    def stream_think_cap(self) -> int:
        """The cap the stream applies: ``think_cap``, or for 0 (no cap) a count no reasoning
        reaches."""
        return self.think_cap or sys.maxsize

    @property
    def db_path(self) -> Path:
        return self.state_dir / "loopd.db"

    @property
    def workspaces(self) -> Path:
        return self.workspace_dir or self.state_dir / "workspaces"


# The answer's room below max_tokens once the thinking is capped: a short answer or a tool call of
# a few hundred lines. Less, and a capped turn ends cut off by max_tokens instead of answering.
ANSWER_ROOM: Final = 1024


def _think_cap_leaves_answer_room(settings: Settings) -> str | None:
    cap, ceiling = settings.think_cap, settings.max_tokens
    if cap == 0 or cap + ANSWER_ROOM <= ceiling:
        return None
    return (
        f"think_cap {cap} leaves no room for the answer below max_tokens {ceiling}: "
        f"think_cap + {ANSWER_ROOM} must be at most max_tokens (think_cap 0: no cap)"
    )


def _one_endpoint_form(settings: Settings) -> str | None:
    mixed = [name for name in SHORTHAND_SETTINGS if name in settings.model_fields_set]
    if not settings.endpoint or not mixed:
        return None
    named = ", ".join(f"{name} (LOOPD_{name.upper()})" for name in mixed)
    return (
        f"{named} set beside [[endpoint]] tables: give each server's url, model and slots in "
        "its own table"
    )


RULES: Final[tuple[Rule[Settings], ...]] = (
    Rule("think_cap_leaves_answer_room", _think_cap_leaves_answer_room),
    Rule("one_endpoint_form", _one_endpoint_form),
)

# Every default, as one typed object (no source is read): the engine's records of these numbers
# default to it.
DEFAULTS: Final = Settings.model_construct()


def load_settings(**overrides: Any) -> Settings:
    """The settings from the environment and the ``LOOPD_CONFIG`` file (``overrides`` win);
    ``ConfigError`` with one line for an unknown variable, a bad value, a broken rule or an
    empty variable that would hide a list the file gives (``empty_over_file``)."""
    settings = configload.load(Settings, **overrides)
    if (problem := empty_over_file(os.environ)) is not None:
        raise ConfigError(problem)
    return settings


# The lists that decide whom loopd answers: an environment file that leaves one of them empty
# (``LOOPD_MM_ALLOWED_USERS=``) would silently replace the file's list with nobody.
_GUARDED_LISTS: Final = ("allowed_users", "allowed_teams", "allowed_channels", "admins")


def empty_over_file(environ: Mapping[str, str]) -> str | None:
    """The one line for a ``LOOPD_MM_*`` list set empty in the environment while the
    ``LOOPD_CONFIG`` file gives that list: the environment wins, so the file's list would be
    ignored without a word. None when there is no such clash."""
    config = environ.get("LOOPD_CONFIG")
    if not config:
        return None
    try:
        table = tomllib.loads(Path(config).read_text(encoding="utf-8")).get("mm")
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError):
        return None  # the loader has said what is wrong with the file
    if not isinstance(table, dict):
        return None
    for key in _GUARDED_LISTS:
        variable = f"LOOPD_MM_{key.upper()}"
        if variable in environ and not environ[variable].strip() and table.get(key):
            return (
                f"{variable} is set but empty, and would replace {key} under [mm] in {config} "
                "with nobody: give the list in one place (remove the variable, or set it)"
            )
    return None


def settings_table(model: type[BaseSettings] = Settings) -> str:
    """The README's tables of every knob of ``model``, as ``loopd config --table`` prints them."""
    return "\n\n".join(settings_tables(model))


def settings_tables(model: type[BaseSettings] = Settings) -> list[str]:
    """One Markdown table of the top-level knobs, then one per nested table (``[mm]``), generated
    so the README cannot drift from the model."""
    naming = configload.Naming.of(model)
    tables = [_table(naming, (), model)]
    for name, field in model.model_fields.items():
        nested = configload.nested_model(field.annotation)
        if nested is not None:
            tables.append(_table(naming, (name,), nested))
    return tables


def _table(naming: configload.Naming, table: tuple[str, ...], model: type[BaseModel]) -> str:
    rows = ["| Variable | Default | Meaning |", "|---|---|---|"]
    for name, field in model.model_fields.items():
        if configload.nested_model(field.annotation) is not None:
            continue
        if field.default_factory is not None:
            default = "(see meaning)"
        else:
            default = f"`{_render_default(field.default)}`"
        variable = naming.variable((*table, name))
        rows.append(f"| `{variable}` | {default} | {field.description or ''} |")
    return "\n".join(rows)


def _render_default(value: Any) -> str:
    if isinstance(value, tuple):
        return ",".join(str(v) for v in value)
    return str(value)
