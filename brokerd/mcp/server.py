"""One MCP server's life in brokerd: connect, list its tools, serve calls, restart when it ends.

``McpServer.run`` is a supervisor loop, one task per server for brokerd's whole life: it opens
the connection (the SDK's ``Client`` over a transport), lists the tools, then waits for the
connection to end or for ``notifications/tools/list_changed`` (which lists them again). When the
connection ends (the server crashed, exited, sent too much), the server is ``down`` and is
restarted after a backoff (``RESTART``: 1 s, doubling to a minute) that grows with each failure
in a row, reset once the server stayed up ``STABLE_S``; calls meanwhile fail at once
with a tool error saying so. Cancelling ``run`` (brokerd's shutdown) stops the server.

What a server can make brokerd wait for or hold is bounded by its config: ``initialize`` must be
answered within ``handshake_timeout_s``, each ``tools/list`` page within ``list_page_timeout_s``,
and a listing's pages together hold at most ``list_max_bytes`` of tools. A server that fails one
is down like a crashed one (one log line saying which), and restarted with the same backoff.

The handshake is the initialize handshake (``mode="legacy"``), which every server speaks, the
2025 ones and the 2026 ones alike, and over which ``list_changed`` arrives as a plain
notification.
"""

import functools
import logging
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final, Literal

import anyio
import mcp_types as types
from mcp import Client
from mcp.client._transport import Transport
from mcp.shared.exceptions import MCPError
from pydantic import ValidationError

from brokerd.errors import BrokerdError
from brokerd.mcp.config import McpServerConfig
from brokerd.mcp.specs import offered_tools
from brokerd.mcp.transport import ConfinedStdio
from brokerd.tools.catalogue import ToolSpec
from brokerd.tools.errors import ToolFailure
from loopcommon.backoff import Backoff
from loopcommon.exceptiongroups import sole_kind

logger = logging.getLogger(__name__)

State = Literal["starting", "up", "down"]
CLIENT_INFO: Final = types.Implementation(name="brokerd", version="0.1.0")
MAX_LIST_PAGES: Final = 100
# How long a reason may be, in the log and in the model's tool error.
MAX_REASON_CHARS: Final = 400


# A crashed server is restarted after 1 s (a fresh process, so soon is cheap), then 2, 4 ... s up
# to a minute while it keeps failing; one that stayed up STABLE_S starts the count again.
RESTART: Final = Backoff(first_s=1.0, cap_s=60.0)
STABLE_S: Final = 60.0


class ListingError(BrokerdError):
    """The server's tool listing broke a bound; the message says which, for the log."""


@dataclass(frozen=True)
class ServerStatus:
    name: str
    state: State
    detail: str
    tools: tuple[ToolSpec, ...]


TransportFactory = Callable[[], ConfinedStdio | str]


class McpServer:
    def __init__(
        self,
        config: McpServerConfig,
        transport: TransportFactory,
        *,
        backoff: Backoff = RESTART,
    ) -> None:
        self.config = config
        self._transport = transport
        self._backoff = backoff
        self.state: State = "starting"
        self.detail = ""
        self.tools: tuple[ToolSpec, ...] = ()
        self.attempts = 0  # connections tried, for tests and the log
        self._client: Client | None = None
        self._ended: anyio.Event | None = None
        self._ended_reason: Callable[[], str] = lambda: "the connection ended"
        self._relist = anyio.Event()
        self._changed = anyio.Event()

    @property
    def name(self) -> str:
        return self.config.name

    def status(self) -> ServerStatus:
        return ServerStatus(self.name, self.state, self.detail, self.tools)

    async def wait_for(self, predicate: Callable[["McpServer"], bool]) -> None:
        """Until ``predicate(self)`` holds; it is checked after every change of state or tools."""
        while not predicate(self):
            await self._changed.wait()

    # --- the supervisor ------------------------------------------------------------------------

    async def run(self) -> None:
        failures = 0
        while True:
            started = anyio.current_time()
            reason = await self._connect_once()
            was_stable = self.state == "up" and (anyio.current_time() - started >= STABLE_S)
            failures = 1 if was_stable else failures + 1
            delay = self._backoff.delay(failures)
            logger.warning("mcp server %s is down: %s; restart in %g s", self.name, reason, delay)
            self._set("down", f"{reason}; brokerd restarts it in {delay:g} s")
            await anyio.sleep(delay)

    async def _connect_once(self) -> str:
        """One connection, from start to end; why it ended."""
        self.attempts += 1
        self._set("starting", "connecting")
        transport = self._transport()
        ended = anyio.Event()
        if isinstance(transport, ConfinedStdio):
            ended = transport.ended
            self._ended_reason = lambda: transport.reason or "the connection ended"
        else:
            self._ended_reason = lambda: "the connection was lost"
        self._ended = ended
        self._relist = anyio.Event()
        server: Transport | str = transport
        reason = "the connection ended"
        handshake_s = self.config.handshake_timeout_s
        try:
            # The deadline covers entering the client (the initialize handshake) only.
            with anyio.CancelScope(deadline=anyio.current_time() + handshake_s) as handshake:
                async with Client(
                    server,
                    mode="legacy",
                    message_handler=self._on_message,
                    client_info=CLIENT_INFO,
                    cache=None,
                ) as client:
                    handshake.deadline = math.inf
                    await self._list(client)
                    self._client = client
                    self._set("up", "")
                    logger.info("mcp server %s is up: %d tools", self.name, len(self.tools))
                    while await _first_of(ended, self._relist) is self._relist:
                        self._relist = anyio.Event()
                        await self._list(client)
                        self._set("up", "")
                        logger.info(
                            "mcp server %s changed its tools: %d", self.name, len(self.tools)
                        )
            if handshake.cancelled_caught:
                reason = f"did not answer initialize within {handshake_s:g} s"
            elif ended.is_set():
                reason = self._ended_reason()
        except Exception as exc:  # whatever the server or its transport did, it is only down
            # The client's task group wraps a broken bound in a group; that is the reason.
            listing = exc if isinstance(exc, ListingError) else None
            if isinstance(exc, BaseExceptionGroup):
                listing = sole_kind(exc, ListingError)
            if listing is not None:
                reason = str(listing)
            elif ended.is_set():
                reason = self._ended_reason()
            else:
                reason = f"cannot connect: {describe(exc)}"
        finally:
            # A call still waiting on this connection learns at once that it is over, and why.
            self._client = None
            self._ended_reason = functools.partial(str, reason)
            ended.set()
        return reason

    async def _list(self, client: Client) -> None:
        """List every page of tools; ``ListingError`` when a page is late or they grow too big."""
        listed: list[types.Tool] = []
        cursor: str | None = None
        size = 0
        page_s, max_bytes = self.config.list_page_timeout_s, self.config.list_max_bytes
        for number in range(1, MAX_LIST_PAGES + 1):
            with anyio.move_on_after(page_s) as late:
                page = await client.list_tools(cursor=cursor)
            if late.cancelled_caught:
                raise ListingError(f"did not send page {number} of tools/list within {page_s:g} s")
            size += sum(len(tool.model_dump_json(by_alias=True)) for tool in page.tools)
            if size > max_bytes:
                raise ListingError(f"listed over {max_bytes} bytes of tools (list_max_bytes)")
            listed += page.tools
            cursor = page.next_cursor
            if cursor is None:
                break
        offered = offered_tools(self.config, listed)
        for skipped in offered.skipped:
            logger.warning("mcp server %s: tool %s is not offered", self.name, skipped)
        self.tools = offered.specs

    async def _on_message(self, message: Any) -> None:
        if isinstance(message, types.ToolListChangedNotification):
            self._relist.set()
        elif isinstance(message, Exception):
            logger.warning("mcp server %s sent something unreadable: %s", self.name, message)
        else:
            await anyio.lowlevel.checkpoint()

    def _set(self, state: State, detail: str) -> None:
        self.state, self.detail = state, detail[:MAX_REASON_CHARS]
        changed, self._changed = self._changed, anyio.Event()
        changed.set()

    # --- calls ---------------------------------------------------------------------------------

    async def call(self, tool: str, arguments: dict[str, Any]) -> types.CallToolResult:
        """Call ``tool``; ``ToolFailure`` (worded for the model) when the server cannot answer."""
        client, ended = self._client, self._ended
        if client is None or self.state != "up" or ended is None:
            raise ToolFailure(
                f"the MCP server {self.name} is not running ({self.detail or self.state}); "
                "nothing was run. Try again later."
            )
        try:
            return await client.call_tool(tool, arguments)
        except MCPError as exc:
            if exc.code != types.CONNECTION_CLOSED:
                raise ToolFailure(
                    f"the MCP server {self.name} answered with an error: {exc.message}"
                ) from None
        except ValidationError as exc:
            raise ToolFailure(
                f"the MCP server {self.name} answered with something that is not an MCP result "
                f"({exc.error_count()} problems)"
            ) from None
        except (OSError, anyio.BrokenResourceError, anyio.ClosedResourceError) as exc:
            ended.set()
            raise ToolFailure(
                f"the MCP server {self.name} could not be reached: {describe(exc)}"
            ) from None
        # The connection closed under the call: say how the server ended, once it is known.
        with anyio.move_on_after(5.0):
            await ended.wait()
        raise ToolFailure(
            f"the MCP server {self.name} stopped during the call ({self._ended_reason()}); "
            "brokerd restarts it. The call may or may not have taken effect."
        )


async def _first_of(*events: anyio.Event) -> anyio.Event:
    """Wait until one of ``events`` is set; that one."""
    winner: list[anyio.Event] = []
    async with anyio.create_task_group() as group:

        async def wait(event: anyio.Event) -> None:
            await event.wait()
            winner.append(event)
            group.cancel_scope.cancel()

        for event in events:
            group.start_soon(wait, event)
    return winner[0]


def describe(exc: BaseException) -> str:
    """An exception in one line, an exception group by its first leaf."""
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    text = " ".join(str(exc).split()) or type(exc).__name__
    return text[:MAX_REASON_CHARS]
