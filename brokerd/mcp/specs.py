"""A server's tool listing as catalogue entries (pure).

A listed tool is offered when the server's ``tools`` allowlist names it (an empty list offers
all) and it can be offered safely: a name the catalogue can hold, a description within the
catalogue's bound (cut, not refused), and an input schema that is a valid JSON Schema of an
object under its own ``$schema``. Whatever is left out is named in ``skipped`` with why, for the
log: one broken tool does not take the server's other tools away.
"""

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Final

import jsonschema
import mcp_types as types
from pydantic import ValidationError

from brokerd.mcp.config import McpServerConfig
from brokerd.mcp.names import catalogue_name
from brokerd.tools.catalogue import McpRun, ToolSpec
from loopcommon.schemas import check_schema

MAX_DESCRIPTION_CHARS: Final = 2000
CUT_MARK: Final = "..."


@dataclass(frozen=True)
class Offered:
    specs: tuple[ToolSpec, ...]
    skipped: tuple[str, ...]  # "<mcp name>: why", for the log


def offered_tools(config: McpServerConfig, listed: Sequence[types.Tool]) -> Offered:
    allowed = set(config.tools)
    specs: list[ToolSpec] = []
    skipped: list[str] = []
    seen: set[str] = set()
    for tool in listed:
        if allowed and tool.name not in allowed:
            continue
        if tool.name in seen:
            skipped.append(f"{tool.name!r}: listed twice")
            continue
        seen.add(tool.name)
        try:
            specs.append(tool_spec(config, tool))
        except ValueError as exc:
            skipped.append(f"{tool.name[:200]!r}: {exc}")
    for name in sorted(allowed - seen):
        skipped.append(f"{name!r}: in the tools allowlist, but the server does not list it")
    return Offered(tuple(sorted(specs, key=lambda spec: spec.name)), tuple(skipped))


def tool_spec(config: McpServerConfig, tool: types.Tool) -> ToolSpec:
    """The catalogue entry for one listed tool; ``ValueError`` says why it cannot be offered."""
    name = catalogue_name(config.name, tool.name)
    check_input_schema(tool.input_schema)
    description = (tool.description or "").strip() or f"The tool {tool.name} of {config.name}."
    if len(description) > MAX_DESCRIPTION_CHARS:
        description = description[: MAX_DESCRIPTION_CHARS - len(CUT_MARK)] + CUT_MARK
    try:
        return ToolSpec(
            name=name,
            description=description,
            parameters=tool.input_schema,
            run=McpRun(kind="mcp", server=config.name, tool=tool.name),
            timeout_s=config.timeout_s,
            approval=config.approval_mode(),
        )
    except ValidationError as exc:
        raise ValueError(f"not a valid catalogue entry: {exc.errors()[0]['msg']}") from None


def check_input_schema(schema: dict[str, Any]) -> None:
    try:
        check_schema(schema)
    except jsonschema.SchemaError as exc:
        raise ValueError(f"its inputSchema is not a valid JSON Schema: {exc.message}") from None
    except RecursionError:
        raise ValueError("its inputSchema nests too deeply") from None
    if schema.get("type") != "object":
        raise ValueError('its inputSchema is not an object schema ("type": "object")')
