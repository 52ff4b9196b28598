"""brokerd's Prometheus metrics: one registry, one method per event.

Labels are bounded: sockets are brokerd's three, routes are the allowlisted ones (anything else is
``other``), statuses are HTTP codes, refusal reasons come from the list in ``REFUSAL_REASONS``,
tool names from the catalogue (a name the box made up is ``unknown``). MCP servers' state is read
at scrape time (``McpCollector``).
"""

import weakref
from collections.abc import Iterable
from typing import TYPE_CHECKING, Final

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, disable_created_metrics
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from brokerd.observe.context import current
from loopcommon.version import installed_version

if TYPE_CHECKING:
    from brokerd.mcp.servers import McpServers

SECONDS_BUCKETS: Final = (0.005, 0.01, 0.05, 0.1, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 900)
TOOL_BUCKETS: Final = (0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300)
REFUSAL_REASONS: Final = frozenset(
    {
        "route",  # not in the socket's allowlist
        "policy",  # a model, slot, channel or body the config does not allow
        "body_too_large",
        "body_timeout",
        "body_memory",  # the shared body budget was spent
        "body",  # any other unreadable body
        "bad_request",  # the broker's: not JSON, a field missing
        "call_conflict",  # the broker's: a call id reused for another call
    }
)
MCP_STATES: Final = ("starting", "up", "down")
# A counter's ``_created`` series doubles what a scrape carries and no dashboard or rule reads it.
disable_created_metrics()  # type: ignore[no-untyped-call]


def body_reason(status: int) -> str:
    """The refusal reason of a body brokerd would not take, by the status it answered."""
    return {413: "body_too_large", 408: "body_timeout", 503: "body_memory"}.get(status, "body")


class BrokerdMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.build_info = Gauge(
            "brokerd_build_info",
            "Always 1: the installed brokerd, as labels.",
            ["version"],
            registry=r,
        )
        self.build_info.labels(installed_version()).set(1)
        self.requests = Counter(
            "brokerd_requests",
            "Requests served, by socket, route and status (brokerd's own answers included).",
            ["socket", "route", "status"],
            registry=r,
        )
        self.seconds = Histogram(
            "brokerd_request_seconds",
            "From a request's arrival to the end of its answer, by socket and route.",
            ["socket", "route"],
            buckets=SECONDS_BUCKETS,
            registry=r,
        )
        self.in_flight = Gauge(
            "brokerd_requests_in_flight",
            "Requests being served, by socket.",
            ["socket"],
            registry=r,
        )
        self.bytes = Counter(
            "brokerd_streamed_bytes",
            "Body bytes passed through, by socket and direction (to_box: answers; from_box: "
            "request bodies).",
            ["socket", "direction"],
            registry=r,
        )
        self.refusals = Counter(
            "brokerd_refused_requests",
            "Requests brokerd answered itself with a refusal, by socket and reason.",
            ["socket", "reason"],
            registry=r,
        )
        self.tool_calls = Counter(
            "brokerd_tool_calls",
            "call_tool requests, by tool and status (ok, error, timeout, invalid, refused, "
            "replayed, interrupted, needs_approval, denied).",
            ["tool", "status"],
            registry=r,
        )
        self.tool_seconds = Histogram(
            "brokerd_tool_call_seconds",
            "Time a call_tool request took, by tool.",
            ["tool"],
            buckets=TOOL_BUCKETS,
            registry=r,
        )
        self._mcp = McpCollector()
        r.register(self._mcp)

    def served(self, socket: str, route: str, status: str, seconds: float) -> None:
        self.requests.labels(socket, route, status).inc()
        self.seconds.labels(socket, route).observe(seconds)

    def refused(self, reason: str) -> None:
        """brokerd refused the request under way (its socket is the context's)."""
        context = current()
        socket = context.socket if context is not None else "unknown"
        self.refusals.labels(socket, reason if reason in REFUSAL_REASONS else "other").inc()

    def tool_called(self, tool: str, status: str, seconds: float) -> None:
        self.tool_calls.labels(tool, status).inc()
        self.tool_seconds.labels(tool).observe(seconds)

    def watch_mcp(self, servers: "McpServers") -> None:
        """Report these MCP servers' state at every scrape (while they exist)."""
        self._mcp.sources.add(servers)


class McpCollector(Collector):
    """The state of every watched set of MCP servers (one per broker app; held weakly, so an app
    that is gone is forgotten)."""

    def __init__(self) -> None:
        self.sources: weakref.WeakSet[McpServers] = weakref.WeakSet()

    def collect(self) -> Iterable[GaugeMetricFamily | CounterMetricFamily]:
        state = GaugeMetricFamily(
            "brokerd_mcp_server_state",
            "1 for each MCP server's current state (starting, up, down).",
            labels=["server", "state"],
        )
        tools = GaugeMetricFamily(
            "brokerd_mcp_server_tools", "Tools each MCP server offers now.", labels=["server"]
        )
        connects = CounterMetricFamily(
            "brokerd_mcp_server_connects",
            "Connections brokerd has tried to each MCP server.",
            labels=["server"],
        )
        servers = [item for source in list(self.sources) for item in source.servers.items()]
        for name, server in servers:
            for value in MCP_STATES:
                state.add_metric([name, value], 1.0 if server.state == value else 0.0)
            tools.add_metric([name], float(len(server.tools)))
            connects.add_metric([name], float(server.attempts))
        return [state, tools, connects]


BROKERD_METRICS: Final = BrokerdMetrics()
"""The process's metrics, served at ``metrics_addr``."""
