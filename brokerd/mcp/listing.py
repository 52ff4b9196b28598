"""``brokerd tools list [--json]``: the catalogue, each tool's source, whether a call waits for a
person's approval (``ask``) or runs at once (``auto``, ``brokerd.approval``), and its server's
state. A tool of ``[broker.approval]`` that no tool can be is refused, as ``brokerd serve``
refuses it.

The listing is brokerd's own view at startup: the catalogue files, and every ``[[mcp]]`` server
started as ``brokerd serve`` starts it (confined, with the same startup wait), listed, and
stopped. A server that did not come up is shown with why, so a configuration can be checked
before it is served.
"""

import argparse
import json
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final

import anyio

from brokerd.approval import approval_mode
from brokerd.tools.catalogue import BuiltinRun, Catalogue, ToolSpec
from loopcommon.approvals import ApprovalMode

if TYPE_CHECKING:
    from brokerd.mcp.server import ServerStatus
    from brokerd.mcp.servers import McpServers

EXIT_CONFIG: Final = 2


@dataclass(frozen=True)
class ListedTool:
    name: str
    source: str  # builtin, command, or mcp
    mode: str  # ask or auto (``brokerd.approval``); "-" for a server with no tool to show
    server: str | None = None
    state: str | None = None  # the MCP server's: up, down, starting
    detail: str = ""


def register(commands: "argparse._SubParsersAction[argparse.ArgumentParser]") -> None:
    tools = commands.add_parser("tools", help="the tool catalogue")
    actions = tools.add_subparsers(dest="tools_command", required=True)
    listing = actions.add_parser(
        "list",
        help="every tool with its source (builtin, command, MCP server), whether it asks a "
        "person first (ask) or runs at once (auto), and its state",
    )
    listing.add_argument("--json", action="store_true", help="one JSON object, for machines")
    listing.set_defaults(handler=list_tools)


def rows(
    catalogue: Catalogue,
    statuses: "Sequence[ServerStatus]",
    approval: Mapping[str, ApprovalMode] | None = None,
) -> list[ListedTool]:
    """One row per tool, then one per MCP server that has no tool to show (pure); ``approval``
    is ``[broker.approval]``."""
    overrides = approval or {}
    found = [_file_row(spec, approval_mode(spec, overrides)) for spec in catalogue]
    for status in statuses:
        found += [
            ListedTool(
                spec.name,
                "mcp",
                approval_mode(spec, overrides),
                status.name,
                status.state,
                status.detail,
            )
            for spec in status.tools
        ]
        if not status.tools:
            found.append(
                ListedTool(f"{status.name}.*", "mcp", "-", status.name, status.state, status.detail)
            )
    return found


def _file_row(spec: ToolSpec, mode: ApprovalMode) -> ListedTool:
    return ListedTool(spec.name, "builtin" if isinstance(spec.run, BuiltinRun) else "command", mode)


def render(found: Sequence[ListedTool]) -> str:
    table = [("TOOL", "SOURCE", "MODE", "SERVER")]
    for row in found:
        source = f"mcp {row.server}" if row.server else row.source
        state = row.state or "-"
        if row.detail:
            state += f" ({row.detail})"
        table.append((row.name, source, row.mode, state))
    width = [max(len(line[column]) for line in table) for column in (0, 1, 2)]
    return "\n".join(
        f"{name:<{width[0]}}  {source:<{width[1]}}  {mode:<{width[2]}}  {state}"
        for name, source, mode, state in table
    )


def as_json(found: Sequence[ListedTool], statuses: "Sequence[ServerStatus]") -> dict[str, Any]:
    return {
        "tools": [
            {"name": row.name, "source": row.source, "mode": row.mode}
            | ({"server": row.server, "up": row.state == "up"} if row.server else {})
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
    from brokerd.config import check_approval_names, load_settings
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
        approval = settings.broker.approval if settings.broker else {}
        check_approval_names(approval, catalogue.tools, [m.name for m in settings.mcp])
        hidden = own_paths(settings)
        if settings.broker is not None:
            audit = settings.broker.audit_db
            hidden += [audit.with_name(audit.name + suffix) for suffix in AUDIT_SUFFIXES]
        servers = McpServers.build(settings.mcp, hidden_paths(hidden))
    except (ConfigError, CatalogueError, ConfinementError) as exc:
        print(f"brokerd: bad config: {exc}", file=sys.stderr)
        return EXIT_CONFIG
    statuses = anyio.run(_start_and_list, servers)
    found = rows(catalogue, statuses, approval)
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
