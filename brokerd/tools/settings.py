"""What the tool broker is configured with. brokerd's config builds one of these."""

from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

from loopcommon.approvals import ApprovalMode

DEFAULT_CATALOGUE_DIR = Path(__file__).parent / "catalogue"


class BrokerSettings(BaseModel):
    """Settings for ``create_broker_app``.

    Per-tool ``timeout_s`` and ``output_cap_bytes`` in a catalogue file override the defaults here.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    audit_db: Path = Field(
        description="SQLite file of the append-only audit log (created if absent)."
    )
    audit_retention_days: float | None = Field(
        default=None,
        gt=0,
        description=(
            "Audit rows older than this many days are deleted by `brokerd audit prune` and when "
            "brokerd starts (the cutoff recorded first); unset keeps every row."
        ),
    )
    audit_excerpt_bytes: int = Field(
        default=4096,
        ge=0,
        le=1024 * 1024,
        description="First bytes of a find_tool query or a call's arguments the audit log keeps "
        "(with the whole's length and sha256).",
    )
    audit_result_bytes: int = Field(
        default=80 * 1024,
        ge=0,
        le=64 * 1024 * 1024,
        description="First bytes of a result the audit log keeps (a replay shows these).",
    )
    audit_session_bytes_per_minute: int = Field(
        default=1024 * 1024,
        ge=0,
        description="Text one session's rows may store per minute; past it rows keep no text.",
    )
    audit_bytes_per_minute: int = Field(
        default=16 * 1024 * 1024,
        ge=0,
        description="Text all sessions' rows may store per minute; past it rows keep no text.",
    )
    catalogue_dir: Path = Field(
        default=DEFAULT_CATALOGUE_DIR, description="Folder of tool definitions, one file per tool."
    )
    default_timeout_s: float = Field(default=30.0, gt=0, le=3600)
    body_cap_bytes: int = Field(
        default=1024 * 1024,
        gt=0,
        le=64 * 1024 * 1024,
        description="Largest find_tool or call_tool request body (arguments included).",
    )
    default_output_cap_bytes: int = Field(default=64 * 1024, gt=0, le=64 * 1024 * 1024)
    find_tool_limit: int = Field(
        default=3, ge=1, le=20, description="How many schemas one find_tool result shows."
    )
    web_fetch_allowlist: tuple[str, ...] = Field(
        default=(),
        description=(
            "Hosts web_fetch may reach. An entry matches that host and its subdomains; "
            "empty means web_fetch refuses every URL."
        ),
    )
    web_fetch_max_redirects: int = Field(default=5, ge=0, le=20)
    host_path_roots: tuple[Path, ...] = Field(
        default=(),
        description=(
            "Host folders that tools taking a host path (git_log's repo) may read, e.g. the "
            "box's workspaces; a call sees only the folder holding its path, read-only. Empty "
            "means such tools refuse every path."
        ),
    )
    approval: dict[str, ApprovalMode] = Field(
        default_factory=dict,
        description=(
            "Per tool (a catalogue tool's name, or an MCP tool's server.tool): ask (each call "
            "waits for a person's approval) or auto (runs at once). Over the tool's own setting; "
            "unset, a tool that declares network or writes asks."
        ),
    )
