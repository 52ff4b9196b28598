"""``brokerd tools list [--json]``: the catalogue, each tool's source, and its server's state.

The listing is brokerd's own view at startup: the catalogue files, and every ``[[mcp]]`` server
started as ``brokerd serve`` starts it (confined, with the same startup wait), listed, and
stopped. A server that did not come up is shown with why, so a configuration can be checked
before it is served.
"""

import argparse
import json
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final

import anyio

from brokerd.tools.catalogue import BuiltinRun, Catalogue, CommandRun, McpRun

if TYPE_CHECKING:
    from brokerd.mcp.server import ServerStatus
    from brokerd.mcp.servers import McpServers

EXIT_CONFIG: Final = 2


@dataclass(frozen=True)
class ListedTool:
    name: str
    source: str  # builtin, command, or mcp
    server: str | None = None
    state: str | None = None  # the MCP server's: up, down, starting
    detail: str = ""


def register(commands: "argparse._SubParsersAction[argparse.ArgumentParser]") -> None:
    tools = commands.add_parser("tools", help="the tool catalogue")
    actions = tools.add_subparsers(dest="tools_command", required=True)
    listing = actions.add_parser(
        "list", help="every tool with its source (builtin, command, MCP server) and its state"
    )
    listing.add_argument("--json", action="store_true", help="one JSON object, for machines")
    listing.set_defaults(handler=list_tools)


def rows(catalogue: Catalogue, statuses: "Sequence[ServerStatus]") -> list[ListedTool]:
    """One row per tool, then one per MCP server that has no tool to show (pure)."""
    found = [_file_row(spec.name, spec.run) for spec in catalogue]
    for status in statuses:
        found += [
            ListedTool(spec.name, "mcp", status.name, status.state, status.detail)
            for spec in status.tools
        ]
        if not status.tools:
            found.append(
                ListedTool(f"{status.name}.*", "mcp", status.name, status.state, status.detail)
            )
    return found


def _file_row(name: str, run: BuiltinRun | CommandRun | McpRun) -> ListedTool:
    return ListedTool(name, "builtin" if isinstance(run, BuiltinRun) else "command")


def render(found: Sequence[ListedTool]) -> str:
    table = [("TOOL", "SOURCE", "SERVER")]
    for row in found:
        source = f"mcp {row.server}" if row.server else row.source
        state = row.state or "-"
        if row.detail:
            state += f" ({row.detail})"
        table.append((row.name, source, state))
    width = [max(len(line[column]) for line in table) for column in (0, 1)]
    return "\n".join(
        f"{name:<{width[0]}}  {source:<{width[1]}}  {state}" for name, source, state in table
    )


def as_json(found: Sequence[ListedTool], statuses: "Sequence[ServerStatus]") -> dict[str, Any]:
    return {
        "tools": [
            {"name": row.name, "source": row.source, "server": row.server, "up": row.state == "up"}
            if row.server
            else {"name": row.name, "source": row.source}
            for row in found
            if not row.name.endswith(".*")
        ],
        "mcp_servers": [
            {"name": s.name, "up": s.state == "up", "state": s.state, "detail": s.detail}
            | {"tools": len(s.tools)}
            for s in statuses
        ],
    }


def list_tools(args: argparse.Namespace) -> int:
    # Imported here, so that brokerd's other commands do not load the broker or the MCP SDK.
    from brokerd.config import load_settings
    from brokerd.confine import ConfinementError, hidden_paths
    from brokerd.mcp.servers import McpServers
    from brokerd.serve import own_paths
    from brokerd.tools.builtins import BUILTINS
    from brokerd.tools.catalogue import load_catalogue
    from brokerd.tools.errors import CatalogueError
    from brokerd.tools.service import AUDIT_SUFFIXES
    from brokerd.tools.settings import DEFAULT_CATALOGUE_DIR
    from loopcommon.errors import ConfigError

    try:
        settings = load_settings()
        folder = settings.broker.catalogue_dir if settings.broker else DEFAULT_CATALOGUE_DIR
        catalogue = load_catalogue(folder, BUILTINS.keys())
        hidden = own_paths(settings)
        if settings.broker is not None:
            audit = settings.broker.audit_db
            hidden += [audit.with_name(audit.name + suffix) for suffix in AUDIT_SUFFIXES]
        servers = McpServers.build(settings.mcp, hidden_paths(hidden))
    except (ConfigError, CatalogueError, ConfinementError) as exc:
        print(f"brokerd: bad config: {exc}", file=sys.stderr)
        return EXIT_CONFIG
    statuses = anyio.run(_start_and_list, servers)
    found = rows(catalogue, statuses)
    if args.json:
        print(json.dumps(as_json(found, statuses), indent=1))
    else:
        print(render(found))
    return 0


async def _start_and_list(servers: "McpServers") -> "list[ServerStatus]":
    async with anyio.create_task_group() as group:
        await group.start(servers.run)
        statuses = servers.statuses()
        group.cancel_scope.cancel()
    return statuses
