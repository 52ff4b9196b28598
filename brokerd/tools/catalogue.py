"""The tool catalogue: one file per tool (JSON or TOML), validated when it is loaded.

A tool file holds the tool's name, its description, a ``parameters`` JSON Schema (an object
schema, checked against the metaschema) and how to run it: a builtin handler, or a host command
whose argv is a fixed template with ``{argument}`` placeholders (never a shell). A command always
runs confined (``brokerd.confine``); its ``confine`` table declares what it may see beyond the
system directories. Every problem is raised as ``CatalogueError`` naming the file, so a bad
catalogue stops brokerd at startup instead of failing a model's call later.
"""

import json
import posixpath
import re
import tomllib
from collections.abc import Collection, Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import jsonschema
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from brokerd.tools.errors import CatalogueError
from loopcommon.approvals import ApprovalMode
from loopcommon.schemas import check_schema

TOOL_NAME_PATTERN = r"^[a-z][a-z0-9_]{0,63}$"
# An MCP server's tool: "<server>.<tool part>" (``brokerd.mcp.names``); never a catalogue file's.
MCP_TOOL_NAME_PATTERN = r"^[a-z][a-z0-9_]{0,31}\.[a-z0-9_-]{1,1600}$"
PLACEHOLDER = re.compile(r"\{([A-Za-z_][A-Za-z0-9_]*)\}")
FILE_FORMATS = {".json": "json", ".toml": "toml"}


class BuiltinRun(BaseModel):
    """Run by a handler inside brokerd (see ``brokerd.tools.builtins``)."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    kind: Literal["builtin"]
    handler: str


class CommandRun(BaseModel):
    """Run as a host process from a fixed argv template; no shell, a clean environment."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    kind: Literal["command"]
    argv: tuple[str, ...] = Field(min_length=1)
    env: dict[str, str] = Field(default_factory=dict)


class McpRun(BaseModel):
    """Run by an MCP server of brokerd's config (``brokerd.mcp``), under its own name there."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    kind: Literal["mcp"]
    server: str
    tool: str


class ConfineSpec(BaseModel):
    """What a command tool may see and use besides the system directories (all optional).

    ``path_arguments`` name string arguments that hold a host path: each call's value must lie
    under one of the broker's ``host_path_roots``, and the root holding it is shown read-only.
    The limits, when given, replace ``loopcommon.sandbox.ResourceLimits``' defaults.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")
    read_only: tuple[str, ...] = ()
    read_write: tuple[str, ...] = ()
    path_arguments: tuple[str, ...] = ()
    network: bool = False
    address_space_bytes: int | None = Field(default=None, gt=0)
    file_size_bytes: int | None = Field(default=None, gt=0)
    processes: int | None = Field(default=None, gt=0, le=4096)
    cpu_s: int | None = Field(default=None, gt=0, le=3600)


class ToolSpec(BaseModel):
    """One tool of the catalogue."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    name: str = Field(pattern=f"{TOOL_NAME_PATTERN}|{MCP_TOOL_NAME_PATTERN}")
    description: str = Field(min_length=1, max_length=2000)
    parameters: dict[str, Any]
    run: BuiltinRun | CommandRun | McpRun = Field(discriminator="kind")
    timeout_s: float | None = Field(default=None, gt=0, le=3600)
    output_cap_bytes: int | None = Field(default=None, gt=0, le=64 * 1024 * 1024)
    confine: ConfineSpec = Field(default_factory=ConfineSpec)
    # ask or auto; None: decided by what the tool declares (``brokerd.approval``).
    approval: ApprovalMode | None = None


@dataclass(frozen=True)
class Catalogue:
    """The loaded tools, by name."""

    tools: Mapping[str, ToolSpec]

    def get(self, name: str) -> ToolSpec | None:
        return self.tools.get(name)

    def __iter__(self) -> Iterator[ToolSpec]:
        return iter(self.tools.values())

    def __len__(self) -> int:
        return len(self.tools)

    def with_tools(self, extra: Iterable[ToolSpec]) -> "Catalogue":
        """These tools and ``extra`` (MCP servers' tools: their dotted names are never a file's)."""
        merged = {**self.tools, **{spec.name: spec for spec in extra}}
        return Catalogue(tools=dict(sorted(merged.items())))


def parse_tool(
    source: str, text: str, file_format: str, known_builtins: Collection[str]
) -> ToolSpec:
    """Parse and validate one tool file's text; ``source`` names the file in every error."""
    raw = _decode(source, text, file_format)
    try:
        spec = ToolSpec.model_validate(raw)
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(part) for part in error['loc']) or '(top level)'}: {error['msg']}"
            for error in exc.errors()
        )
        raise CatalogueError(f"{source}: {problems}") from exc
    _check_parameters(source, spec.parameters)
    _check_run(source, spec, known_builtins)
    return spec


def build_catalogue(specs: Collection[tuple[str, ToolSpec]]) -> Catalogue:
    """Index parsed tools by name; two files declaring one name is an error naming both."""
    by_name: dict[str, ToolSpec] = {}
    sources: dict[str, str] = {}
    for source, spec in specs:
        if spec.name in by_name:
            raise CatalogueError(
                f"{source}: tool name {spec.name!r} is already declared by {sources[spec.name]}"
            )
        by_name[spec.name] = spec
        sources[spec.name] = source
    return Catalogue(tools=dict(sorted(by_name.items())))


def load_catalogue(directory: Path, known_builtins: Collection[str]) -> Catalogue:
    """Read every ``*.json`` and ``*.toml`` file in ``directory`` (other files are ignored)."""
    if not directory.is_dir():
        raise CatalogueError(f"{directory}: the tool catalogue folder does not exist")
    parsed: list[tuple[str, ToolSpec]] = []
    for path in sorted(directory.iterdir()):
        file_format = FILE_FORMATS.get(path.suffix)
        if file_format is None or path.name.startswith("."):
            continue
        try:
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise CatalogueError(f"{path}: cannot be read: {exc}") from exc
        spec = parse_tool(str(path), text, file_format, known_builtins)
        if spec.name != path.stem:
            raise CatalogueError(
                f"{path}: declares tool {spec.name!r}; "
                f"the file must be named {spec.name}{path.suffix}"
            )
        parsed.append((str(path), spec))
    return build_catalogue(parsed)


def argv_placeholders(argv: Collection[str]) -> list[str]:
    """The argument names that an argv template refers to, in order of appearance."""
    return [match.group(1) for part in argv for match in PLACEHOLDER.finditer(part)]


def _decode(source: str, text: str, file_format: str) -> object:
    try:
        if file_format == "json":
            return json.loads(text)
        if file_format == "toml":
            return tomllib.loads(text)
    except (json.JSONDecodeError, tomllib.TOMLDecodeError) as exc:
        raise CatalogueError(f"{source}: not valid {file_format.upper()}: {exc}") from exc
    raise CatalogueError(f"{source}: unknown file format {file_format!r}")


def _check_parameters(source: str, parameters: Mapping[str, Any]) -> None:
    try:
        check_schema(dict(parameters))
    except jsonschema.SchemaError as exc:
        where = "/".join(str(part) for part in exc.absolute_path) or "(root)"
        raise CatalogueError(
            f"{source}: parameters is not a valid JSON Schema at {where}: {exc.message}"
        ) from exc
    if parameters.get("type") != "object":
        raise CatalogueError(f'{source}: parameters must be an object schema ("type": "object")')


def _check_run(source: str, spec: ToolSpec, known_builtins: Collection[str]) -> None:
    run = spec.run
    if isinstance(run, McpRun) or not re.fullmatch(TOOL_NAME_PATTERN, spec.name):
        raise CatalogueError(
            f"{source}: MCP tools come from the [[mcp]] servers of brokerd's config, not from "
            f"catalogue files (a file's tool name matches {TOOL_NAME_PATTERN})"
        )
    if isinstance(run, BuiltinRun):
        if run.handler not in known_builtins:
            known = ", ".join(sorted(known_builtins)) or "none"
            raise CatalogueError(
                f"{source}: unknown builtin handler {run.handler!r} (known: {known})"
            )
        if spec.confine != ConfineSpec():
            raise CatalogueError(f"{source}: confine applies to command tools only")
        return
    _check_confine(source, spec)
    if PLACEHOLDER.search(run.argv[0]):
        raise CatalogueError(f"{source}: argv[0] must be a fixed program, not a placeholder")
    properties: Mapping[str, Any] = spec.parameters.get("properties", {})
    required = set(spec.parameters.get("required", []))
    for name in argv_placeholders(run.argv):
        has_default = isinstance(properties.get(name), dict) and "default" in properties[name]
        if name not in required and not has_default:
            raise CatalogueError(
                f"{source}: argv placeholder {{{name}}} must name a parameter that is "
                "required or has a default"
            )


def _check_confine(source: str, spec: ToolSpec) -> None:
    for path in (*spec.confine.read_only, *spec.confine.read_write):
        if not path.startswith("/") or path != posixpath.normpath(path):
            raise CatalogueError(
                f"{source}: confine path {path!r} must be absolute and normal (no . or ..)"
            )
    properties: Mapping[str, Any] = spec.parameters.get("properties", {})
    for name in spec.confine.path_arguments:
        prop = properties.get(name)
        if not isinstance(prop, dict) or prop.get("type") != "string":
            raise CatalogueError(
                f"{source}: confine.path_arguments names {name!r}, which must be a string parameter"
            )
