"""The ``[[mcp]]`` tables of brokerd's config: one MCP server each."""

import posixpath
from pathlib import Path
from typing import Annotated, Final

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, model_validator

from loopcommon.approvals import ApprovalMode

# A server's name is the first part of its tools' names (``time.get_current_time``): no dot.
SERVER_NAME_PATTERN: Final = r"^[a-z][a-z0-9_]{0,31}$"
WRITABLE_SUFFIX: Final = ":rw"
READ_ONLY_SUFFIX: Final = ":ro"


class DeclaredPath(BaseModel):
    """A host path a stdio server may use, read-only unless declared with ``:rw``."""

    model_config = ConfigDict(frozen=True)
    path: Path
    writable: bool


def parse_path(entry: str) -> DeclaredPath:
    """``/srv/data`` or ``/srv/data:ro`` (read-only), ``/srv/data:rw`` (writable)."""
    writable = entry.endswith(WRITABLE_SUFFIX)
    path = entry.removesuffix(WRITABLE_SUFFIX).removesuffix(READ_ONLY_SUFFIX)
    if not path.startswith("/") or path != posixpath.normpath(path):
        raise ValueError(f"{entry!r}: a path must be absolute and normal (no . or ..)")
    return DeclaredPath(path=Path(path), writable=writable)


class McpServerConfig(BaseModel):
    """One MCP server: ``command`` (stdio, run confined) or ``url`` (streamable HTTP)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str = Field(pattern=SERVER_NAME_PATTERN, description="Its tools appear as name.tool.")
    command: tuple[str, ...] | None = Field(
        default=None, min_length=1, description="argv of a stdio server (no shell)."
    )
    url: str | None = Field(
        default=None, pattern=r"^https?://", description="A streamable HTTP server's endpoint."
    )
    env: dict[str, str] = Field(
        default_factory=dict, description="The stdio server's environment besides PATH and LANG."
    )
    network: bool = Field(default=False, description="May the stdio server reach the network.")
    paths: tuple[str, ...] = Field(
        default=(), description="Host paths the stdio server may read (or write, with :rw)."
    )
    tools: tuple[str, ...] = Field(
        default=(), description="The server's tools offered to the box (empty: all of them)."
    )
    approval: ApprovalMode | None = Field(
        default=None,
        description="ask: each call of its tools waits for a person; auto: runs at once. "
        "Unset: ask when the server may reach the network or write (network, a :rw path, url).",
    )
    timeout_s: float = Field(default=30.0, gt=0, le=3600, description="Each call's time limit.")
    handshake_timeout_s: float = Field(
        default=10.0, gt=0, le=600, description="Time the server has to answer initialize."
    )
    list_page_timeout_s: float = Field(
        default=10.0, gt=0, le=600, description="Time the server has to send each tools/list page."
    )
    list_max_bytes: int = Field(
        default=8 * 1024 * 1024,
        gt=0,
        le=256 * 1024 * 1024,
        description="Largest tool listing, all pages together (the tools as JSON).",
    )

    @model_validator(mode="after")
    def _one_transport(self) -> "McpServerConfig":
        if (self.command is None) == (self.url is None):
            raise ValueError("give either command (a stdio server) or url (streamable HTTP)")
        if self.url is not None and (self.env or self.network or self.paths):
            raise ValueError("env, network and paths apply to a stdio server (command) only")
        for entry in self.paths:
            parse_path(entry)
        return self

    def declared_paths(self) -> tuple[DeclaredPath, ...]:
        return tuple(parse_path(entry) for entry in self.paths)

    def approval_mode(self) -> ApprovalMode:
        """Its tools' mode, unless ``[broker.approval]`` names one of them."""
        if self.approval is not None:
            return self.approval
        acts = (
            self.url is not None or self.network or any(p.writable for p in self.declared_paths())
        )
        return "ask" if acts else "auto"

    @property
    def source(self) -> str:
        """How it is reached, for listings: the command's program, or the URL."""
        return self.url if self.url is not None else " ".join(self.command or ())


def _unique_names(servers: tuple[McpServerConfig, ...]) -> tuple[McpServerConfig, ...]:
    seen: set[str] = set()
    for server in servers:
        if server.name in seen:
            raise ValueError(f"two [[mcp]] servers are named {server.name!r}")
        seen.add(server.name)
    return servers


McpServerConfigs = Annotated[tuple[McpServerConfig, ...], AfterValidator(_unique_names)]
