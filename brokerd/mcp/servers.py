"""All configured MCP servers as one source of the broker's catalogue.

``McpServers`` is built when the broker is (a stdio server that cannot be confined as declared
stops brokerd at startup, like a bad catalogue file), runs every server's supervisor in one task
group for brokerd's life (``run``), offers the tools of every server it has listed, and runs a
call within the tool's timeout and output cap (``call``), returning the same ``ToolOutcome``
that catalogue tools give, so the audit log and the model's text are the broker's as always.
"""

import functools
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Final

import anyio
from anyio.abc import TaskStatus

from brokerd.confine import ConfinementError, confined_argv, detect_host_view
from brokerd.mcp.config import McpServerConfig
from brokerd.mcp.results import result_text
from brokerd.mcp.sandbox import server_confinement, server_env
from brokerd.mcp.server import RESTART, McpServer, ServerStatus
from brokerd.mcp.transport import ConfinedStdio
from brokerd.tools.calls import Ready
from brokerd.tools.catalogue import McpRun, ToolSpec
from brokerd.tools.errors import ToolFailure
from brokerd.tools.execute import CallLimits
from brokerd.tools.wording import ToolOutcome
from loopcommon.backoff import Backoff
from loopcommon.capture import CappedOutput
from loopcommon.sandbox import HiddenPath, HostView

# What one server's message may hold (a result with an image, a long file): beyond it the
# server is stopped rather than held in memory.
MAX_MESSAGE_BYTES: Final = 16 * 1024 * 1024
# How long brokerd's startup waits for its servers' first connections before serving anyway.
STARTUP_WAIT_S: Final = 20.0


class McpServers:
    def __init__(self, servers: Sequence[McpServer]) -> None:
        self.servers: dict[str, McpServer] = {server.name: server for server in servers}

    @classmethod
    def build(
        cls,
        configs: Sequence[McpServerConfig],
        hidden: Sequence[HiddenPath],
        *,
        backoff: Backoff = RESTART,
        max_message_bytes: int = MAX_MESSAGE_BYTES,
        view: Callable[[], HostView] = detect_host_view,
    ) -> "McpServers":
        """``ConfinementError`` when a stdio server cannot run confined as declared."""
        servers = []
        for config in configs:
            if config.url is not None:
                servers.append(
                    McpServer(config, functools.partial(str, config.url), backoff=backoff)
                )
                continue
            env = server_env(config)
            try:
                confinement = server_confinement(config, hidden, env)
                argv = confined_argv(view(), confinement, config.command or (), env)
            except ConfinementError as exc:
                raise ConfinementError(f"mcp server {config.name}: {exc}") from None

            def stdio(name: str = config.name, argv: list[str] = argv) -> ConfinedStdio:
                return ConfinedStdio(name, argv, max_message_bytes=max_message_bytes)

            servers.append(McpServer(config, stdio, backoff=backoff))
        return cls(servers)

    def __bool__(self) -> bool:
        return bool(self.servers)

    async def run(
        self,
        *,
        startup_wait_s: float = STARTUP_WAIT_S,
        task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED,
    ) -> None:
        """Run every server until cancelled; started once each has connected or failed once
        (or ``startup_wait_s`` has passed), so a fresh brokerd's catalogue already has them."""
        async with anyio.create_task_group() as group:
            for server in self.servers.values():
                group.start_soon(server.run)
            with anyio.move_on_after(startup_wait_s):
                for server in self.servers.values():
                    await server.wait_for(lambda server: server.state != "starting")
            task_status.started()

    def tools(self) -> list[ToolSpec]:
        return [spec for server in self.servers.values() for spec in server.tools]

    def statuses(self) -> list[ServerStatus]:
        return [server.status() for server in self.servers.values()]

    async def call(self, plan: Ready, limits: CallLimits) -> ToolOutcome:
        run = plan.spec.run
        assert isinstance(run, McpRun)
        output = CappedOutput(limits.output_cap_bytes)
        failure = ""
        with anyio.move_on_after(limits.timeout_s) as scope:
            try:
                failure = await self._call(run, plan.arguments, output)
            except ToolFailure as exc:
                failure = str(exc)
        if scope.cancelled_caught:
            timed_out = f"timed out after {limits.timeout_s:g} s"
            return ToolOutcome("timeout", output.text(), output.cut, output.cap, timed_out)
        if failure:
            return ToolOutcome("error", output.text(), output.cut, output.cap, failure)
        return ToolOutcome("ok", output.text(), output.cut, output.cap)

    async def _call(self, run: McpRun, arguments: Mapping[str, Any], output: CappedOutput) -> str:
        server = self.servers.get(run.server)
        if server is None:
            raise ToolFailure(f"no MCP server is named {run.server}")
        result = await server.call(run.tool, dict(arguments))
        mapped = result_text(result)
        output.add(mapped.text.encode("utf-8"))
        return "the MCP server reported an error" if mapped.is_error else ""
